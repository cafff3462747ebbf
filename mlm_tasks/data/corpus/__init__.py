"""Corpus sources: where the raw text comes from, as WikiText-style rows split train/validation/test.

    corpus = open_corpus(cfg.corpus)      # one of SOURCES, by corpus.source
    for split, row in corpus.split_rows(part, num_parts): ...

Five sources, one interface (base.Corpus: rows per split, a content fingerprint, a credit):
- embedded_wiki: the real English Wikipedia sample shipped in the gensim wheel (no network; the default);
- wiki_dump: any enwiki `pages-articles*.xml.bz2` dump at a path, parsed the same way (wiki.py);
- hf_dataset: any `datasets` dataset (production default: Salesforce/wikitext, wikitext-103-raw-v1);
- local_files: .txt (a row per line), .jsonl or .parquet files;
- tfrecord_shards: shards tokenized elsewhere, brought as they are (shards.py: token ids, no text).

Every source has a content fingerprint, so unchanged data is never re-tokenized. Splits are
deterministic: by a hash of the article title (or row), never by random draws. `split_rows(part,
num_parts)` yields one partition's (split, row) pairs for every split in one read of the source,
skipping the other partitions' rows before parsing them: the DAGs' mapped `write_shards` tasks each
read only their own part, once (mlm_tasks/data/writer.py).
"""
from __future__ import annotations

from collections.abc import Callable

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.data.corpus.hf_dataset import HFDatasetCorpus
from mlm_tasks.data.corpus.local_files import LocalFilesCorpus
from mlm_tasks.data.corpus.shards import ShardsCorpus
from mlm_tasks.data.corpus.wiki import WikiDumpCorpus, embedded_wiki_path
from mlm_tasks.errors import ConfigError


def _wiki_dump(cfg: CorpusConfig) -> Corpus:
    if not cfg.dump_path:
        raise ConfigError("corpus.source=wiki_dump needs corpus.dump_path.")
    return WikiDumpCorpus(cfg, cfg.dump_path)


SOURCES: dict[str, Callable[[CorpusConfig], Corpus]] = {
    "embedded_wiki": lambda cfg: WikiDumpCorpus(cfg, embedded_wiki_path()),
    "wiki_dump": _wiki_dump,
    "hf_dataset": HFDatasetCorpus,
    "local_files": LocalFilesCorpus,
    "tfrecord_shards": ShardsCorpus,
}


def open_corpus(cfg: CorpusConfig) -> Corpus:
    """The source `corpus.source` names (the config's Literal keeps it to SOURCES' keys)."""
    return SOURCES[cfg.source](cfg)
