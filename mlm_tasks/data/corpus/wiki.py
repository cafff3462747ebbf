"""Wikipedia dumps as rows: the embedded sample shipped in the gensim wheel, or any enwiki dump at a path.
Pages become WikiText-style rows (gensim's `filter_wiki`); each article goes to one split by a hash of its title.
"""

from __future__ import annotations

import bz2
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus, split_of
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS

log = logging.getLogger(__name__)
EMBEDDED_WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_HEADING = re.compile(r"^(={2,6})\s*(.*?)\s*\1\s*$")
_MARKUP = re.compile(r"'{2,}")


def embedded_wiki_path() -> str:
    # Found without importing gensim, whose __init__ costs seconds that validate and the fingerprint need not pay.
    import importlib.util

    spec = importlib.util.find_spec("gensim")
    folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else ""
    path = os.path.join(folder, "test", "test_data", EMBEDDED_WIKI_FILE)
    if not folder or not os.path.exists(path):
        raise ConfigError(
            f"The embedded Wikipedia sample {EMBEDDED_WIKI_FILE} is missing: install "
            "gensim==4.4.0 (requirements.txt), whose wheel ships it."
        )
    return path


def wikitext_rows(wikitext_body: str) -> list[str]:
    """Turn one article's filtered wiki text into WikiText-103-style rows: one row per paragraph,
    headings as ' = = Title = = ', bold/italic quotes dropped, empty rows dropped."""
    rows = []
    for line in wikitext_body.split("\n"):
        line = _MARKUP.sub("", line).strip()
        if not line:
            continue
        if heading := _HEADING.match(line):
            marks = " ".join(heading.group(1))  # "===" -> "= = ="
            rows.append(f"{marks} {heading.group(2)} {marks}")
        elif len(line) > 1:
            rows.append(line)
    return rows


@dataclass
class Article:
    title: str
    rows: list[str]


class WikiDumpCorpus(Corpus):
    credit = (
        "Text from English Wikipedia (https://en.wikipedia.org), licensed CC BY-SA 4.0; sample shipped "
        "with gensim's test data."
    )

    def __init__(self, cfg: CorpusConfig, path: str | None):
        if not path:
            raise ConfigError("corpus.source=wiki_dump needs corpus.dump_path.")
        if not os.path.exists(path):
            raise ConfigError(
                f"Wikipedia dump {path} does not exist: set corpus.dump_path to a pages-articles*.xml.bz2 file."
            )
        self.cfg, self.path = cfg, path
        self.articles_seen: dict[str, int] = {}

    def fingerprint(self) -> str:
        return "wiki:" + storage.sha256(self.path)[:16] + f":max={self.cfg.max_articles}"

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

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """One parse of the dump for every split; articles_seen counts this partition's articles per split."""
        self.articles_seen.update(dict.fromkeys(SPLITS, 0))
        for article in self.articles(part, num_parts):
            split = split_of(article.title, self.cfg.validation_fraction, self.cfg.test_fraction)
            self.articles_seen[split] += 1
            for row in article.rows:
                yield split, row
