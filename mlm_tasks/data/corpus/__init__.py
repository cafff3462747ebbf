"""Corpus sources: where the raw text comes from, as rows split train/validation/test (base.Corpus).

corpus = open_corpus(cfg.corpus)      # one of SOURCES, by corpus.source
for split, row in corpus.split_rows(part, num_parts): ...
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

SOURCES: dict[str, Callable[[CorpusConfig], Corpus]] = {
    "embedded_wiki": lambda cfg: WikiDumpCorpus(cfg, embedded_wiki_path()),
    "wiki_dump": lambda cfg: WikiDumpCorpus(cfg, cfg.dump_path),
    "hf_dataset": HFDatasetCorpus,
    "local_files": LocalFilesCorpus,
    "tfrecord_shards": ShardsCorpus,
    "mixture": MixtureCorpus,
}


def open_corpus(cfg: CorpusConfig) -> Corpus:
    """The source `corpus.source` names (the config's Literal keeps it to SOURCES' keys)."""
    return SOURCES[cfg.source](cfg)
