"""Corpus sources: where the raw text comes from, as WikiText-style rows split train/validation/test.

    corpus = open_corpus(cfg.corpus)      # one of SOURCES, by corpus.source
    for split, row in corpus.split_rows(part, num_parts): ...

Five sources (docs/data.md#sources-corpussource), and a weighted mixture of the text ones (mixture.py,
docs/data.md#mixtures); one interface (base.Corpus: rows per split, a content fingerprint, a credit).
Before editing a source: its fingerprint is what lets unchanged data skip tokenizing; its splits come
from a hash of the article title (or row), never from random draws; and `split_rows` yields one
partition's rows of every split in one read, skipping the other partitions' rows before parsing them,
so each mapped `write_shards` task reads only its own part, once.
"""

from __future__ import annotations

from collections.abc import Callable

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.data.corpus.hf_dataset import HFDatasetCorpus
from mlm_tasks.data.corpus.local_files import LocalFilesCorpus
from mlm_tasks.data.corpus.mixture import MixtureCorpus
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
    "mixture": MixtureCorpus,
}


def open_corpus(cfg: CorpusConfig) -> Corpus:
    """The source `corpus.source` names (the config's Literal keeps it to SOURCES' keys)."""
    return SOURCES[cfg.source](cfg)
