"""Corpus sources: where the raw text comes from, as WikiText-style rows split train/validation/test.

Four sources, one interface (`open_corpus(cfg).rows(split)` yields non-empty text rows):
- embedded_wiki: the real English Wikipedia sample shipped in the gensim wheel (no network; the default).
- wiki_dump: any enwiki `pages-articles*.xml.bz2` dump at a path, parsed the same way.
- hf_dataset: any `datasets` dataset (production default: Salesforce/wikitext, wikitext-103-raw-v1).
- local_files: .txt (a row per line), .jsonl or .parquet files.

Every source has a content fingerprint, so unchanged data is never re-tokenized. Splits are
deterministic: by a hash of the article title (or row), never by random draws. `split_rows(part,
num_parts)` yields one partition's (split, row) pairs for every split in one read of the source,
skipping the other partitions' rows before parsing them: the DAGs' mapped `write_shards` tasks each
read only their own part, once (mlm_tasks/shards_parallel.py).
"""
from __future__ import annotations

import bz2
import glob
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from mlm_tasks.config import ConfigError, CorpusConfig
from mlm_tasks.corpus_base import Corpus
from mlm_tasks.paths import SPLITS

log = logging.getLogger(__name__)

EMBEDDED_WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WIKI_CREDIT = ("Text from English Wikipedia (https://en.wikipedia.org), licensed CC BY-SA 4.0; sample shipped "
               "with gensim's test data.")
_HEADING = re.compile(r"^(={2,6})\s*(.*?)\s*\1\s*$")
_MARKUP = re.compile(r"'{2,}")
PARTITION_BLOCK = 1000  # consecutive lines of local files that go to the same partition


def embedded_wiki_path() -> str:
    import gensim

    path = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", EMBEDDED_WIKI_FILE)
    if not os.path.exists(path):
        raise ConfigError(f"The embedded Wikipedia sample {EMBEDDED_WIKI_FILE} is missing: install "
                          "gensim==4.4.0 (requirements.txt), whose wheel ships it.")
    return path


def split_of(key: str, validation_fraction: float, test_fraction: float) -> str:
    """Deterministic split by a hash of `key` (an article title): stable across runs and machines."""
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
    if u < validation_fraction:
        return "validation"
    if u < validation_fraction + test_fraction:
        return "test"
    return "train"


def wikitext_rows(wikitext_body: str) -> list[str]:
    """Turn one article's filtered wiki text into WikiText-103-style rows: one row per paragraph,
    headings as ' = = Title = = ', bold/italic quotes dropped, empty rows dropped."""
    rows = []
    for line in wikitext_body.split("\n"):
        line = _MARKUP.sub("", line).strip()
        if not line:
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            marks = " ".join(["="] * level)
            rows.append(f"{marks} {heading.group(2)} {marks}")
        elif len(line) > 1:
            rows.append(line)
    return rows


@dataclass
class Article:
    title: str
    rows: list[str]


class WikiDumpCorpus(Corpus):
    credit = WIKI_CREDIT

    def __init__(self, cfg: CorpusConfig, path: str):
        if not os.path.exists(path):
            raise ConfigError(f"Wikipedia dump {path} does not exist: set corpus.dump_path to a "
                              "pages-articles*.xml.bz2 file.")
        self.cfg, self.path = cfg, path
        self.articles_seen: dict[str, int] = {}

    def fingerprint(self) -> str:
        return "wiki:" + _file_digest(self.path) + f":max={self.cfg.max_articles}"

    def articles(self, part: int = 0, num_parts: int = 1) -> Iterator[Article]:
        """Articles of partition `part`: page i (counting non-redirect pages) goes to partition i % num_parts.
        Other partitions' pages are skipped before filter_wiki, the costly part. With max_articles the
        first max_articles articles are found first, so every page is parsed and the count is dealt instead."""
        from gensim.corpora.wikicorpus import extract_pages, filter_wiki

        count, page = 0, -1
        limit = self.cfg.max_articles
        with bz2.open(self.path, "rb") as f:
            for title, text, _pageid in extract_pages(f, filter_namespaces=("0",)):
                if text.lstrip().lower().startswith("#redirect"):
                    continue
                page += 1
                if not limit and page % num_parts != part:
                    continue
                rows = wikitext_rows(filter_wiki(text))
                if not rows:
                    continue
                count += 1
                if not limit or (count - 1) % num_parts == part:
                    yield Article(title, [f"= {title} ="] + rows)
                if limit and count >= limit:
                    return

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        for _split, row in self.split_rows(part, num_parts, only=split):
            yield row

    def split_rows(self, part: int = 0, num_parts: int = 1, only: str | None = None) -> Iterator[tuple[str, str]]:
        """One parse of the dump for every split (the XML parse is the costly part); articles_seen counts
        this partition's articles per split."""
        self.articles_seen.update(dict.fromkeys([only] if only else SPLITS, 0))
        for article in self.articles(part, num_parts):
            split = split_of(article.title, self.cfg.validation_fraction, self.cfg.test_fraction)
            if only and split != only:
                continue
            self.articles_seen[split] += 1
            for row in article.rows:
                yield split, row


class LocalFilesCorpus(Corpus):
    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.files: list[str] = []
        for pattern in cfg.local_paths:
            matched = sorted(glob.glob(pattern))
            if not matched:
                raise ConfigError(f"corpus.local_paths entry {pattern!r} matches no file: check the path "
                                  "(relative paths are relative to the worker's working directory).")
            self.files.extend(matched)
        if not self.files:
            raise ConfigError("corpus.source=local_files needs corpus.local_paths (files or globs).")
        for path in self.files:
            if not path.endswith((".txt", ".jsonl", ".parquet")):
                raise ConfigError(f"{path}: unsupported file type; use .txt, .jsonl or .parquet.")

    def fingerprint(self) -> str:
        return "files:" + ",".join(f"{os.path.basename(p)}={_file_digest(p)}" for p in self.files)

    def _lines(self, path: str, keep) -> Iterator[tuple[int, str]]:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not keep():
                    continue
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ConfigError(f"{path} line {lineno} is not valid UTF-8 ({err.reason} at byte "
                                      f"{err.start}): re-encode the file as UTF-8.") from None

    def _all_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[str]:
        """Rows of partition `part`: blocks of PARTITION_BLOCK consecutive lines/records of the files
        (blank ones included, so the split is the same for every num_parts), block b to partition
        b % num_parts. Other partitions' lines are skipped undecoded."""
        index = -1

        def keep() -> bool:
            nonlocal index
            index += 1
            return (index // PARTITION_BLOCK) % num_parts == part

        for path in self.files:
            if path.endswith(".txt"):
                for _, line in self._lines(path, keep):
                    yield line
            elif path.endswith(".jsonl"):
                for lineno, line in self._lines(path, keep):
                    if line.strip():
                        try:
                            yield json.loads(line).get(self.cfg.text_column, "")
                        except (json.JSONDecodeError, AttributeError):
                            raise ConfigError(f"{path} line {lineno} is not a JSON object: fix the line or use "
                                              ".txt for plain text.") from None
            else:
                import pyarrow.parquet as pq

                for batch in pq.ParquetFile(path).iter_batches(columns=[self.cfg.text_column]):
                    texts = batch.column(0).to_pylist()
                    if num_parts == 1:  # every row is this partition's: no per-row bookkeeping
                        yield from texts
                        continue
                    for text in texts:
                        if keep():
                            yield text

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        for row_split, row in self.split_rows(part, num_parts):
            if row_split == split:
                yield row

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        for row in self._all_rows(part, num_parts):
            row = (row or "").strip()
            if row:
                yield split_of(row, self.cfg.validation_fraction, self.cfg.test_fraction), row


class HFDatasetCorpus(Corpus):
    """Any `datasets` dataset. Uses its own validation/test splits when it has them."""

    def __init__(self, cfg: CorpusConfig):
        self.cfg = cfg
        self.credit = f"Dataset {cfg.hf_path} ({cfg.hf_name}); see its dataset card for license and credit."

    def fingerprint(self) -> str:
        from huggingface_hub import HfApi

        revision = self.cfg.hf_revision
        if revision is None:  # resolve "main" to a commit so a changed dataset changes the fingerprint
            revision = HfApi().dataset_info(self.cfg.hf_path).sha
        return f"hf:{self.cfg.hf_path}:{self.cfg.hf_name}:{revision}"

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        import datasets

        available = datasets.get_dataset_split_names(self.cfg.hf_path, self.cfg.hf_name,
                                                     revision=self.cfg.hf_revision)
        if split not in available:
            raise ConfigError(f"{self.cfg.hf_path} has no {split!r} split (has {available}).")
        ds = datasets.load_dataset(self.cfg.hf_path, self.cfg.hf_name, split=split,
                                   revision=self.cfg.hf_revision)
        if num_parts > 1:
            ds = ds.shard(num_shards=num_parts, index=part, contiguous=True)
        for text in ds[self.cfg.text_column]:
            # WikiText: half the rows are empty, the rest end in a newline.
            text = (text or "").strip()
            if text:
                yield text


def open_corpus(cfg: CorpusConfig) -> Corpus:
    if cfg.source == "tfrecord_shards":  # bring your own shards: token ids, no text
        from mlm_tasks.byo_shards import ShardsCorpus

        return ShardsCorpus(cfg)
    if cfg.source == "embedded_wiki":
        return WikiDumpCorpus(cfg, embedded_wiki_path())
    if cfg.source == "wiki_dump":
        if not cfg.dump_path:
            raise ConfigError("corpus.source=wiki_dump needs corpus.dump_path.")
        return WikiDumpCorpus(cfg, cfg.dump_path)
    if cfg.source == "local_files":
        return LocalFilesCorpus(cfg)
    return HFDatasetCorpus(cfg)


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]
