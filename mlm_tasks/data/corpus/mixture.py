"""Several text sources as one corpus (corpus.source: mixture): the shard writer keeps each source's shards
apart, training draws from them by weight.

    corpus = MixtureCorpus(cfg)          # cfg.mixture: [{name, weight, source, ...}, ...]
    for source, split, row in corpus.source_rows(part, num_parts): ...

Each source is opened as a corpus of its own (`open_corpus` of its settings, the corpus-wide splits and
filters) and read in a fixed order, by name, so reordering corpus.mixture changes nothing. The
fingerprint is the sources' fingerprints by name, not their weights: weights are applied when training
(mlm_tasks/data/input.py), so a run that changes only the weights reuses the shard set.
docs/data.md#mixtures
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.paths import SPLITS

# The sources that read a column: their own fingerprints leave text_column out, the mixture's does not.
_COLUMN_SOURCES = ("hf_dataset", "local_files")


class MixtureCorpus(Corpus):
    def __init__(self, cfg: CorpusConfig):
        from mlm_tasks.data.corpus import open_corpus

        self.cfg = cfg
        self.settings = {s.name: s for s in sorted(cfg.mixture, key=lambda s: s.name)}
        self.sources: dict[str, Corpus] = {name: open_corpus(cfg.for_source(s)) for name, s in self.settings.items()}
        self.credit = " ".join(f"[{name}] {c.credit}" for name, c in self.sources.items() if c.credit)
        self._fingerprint: str | None = None

    def fingerprint(self) -> str:
        """`mixture:` and, by name, each source's kind and fingerprint (readable: the manifest keeps it)."""
        if self._fingerprint is None:
            parts = {}
            for name, corpus in self.sources.items():
                s = self.settings[name]
                column = {"text_column": s.text_column} if s.source in _COLUMN_SOURCES else {}
                parts[name] = {"source": s.source, "fingerprint": corpus.fingerprint(), **column}
            self._fingerprint = "mixture:" + json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return self._fingerprint

    def source_names(self) -> list[str]:
        return list(self.sources)

    def source_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str, str]]:
        for name, corpus in self.sources.items():
            for split, row in corpus.split_rows(part, num_parts):
                yield name, split, row

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """The same stream as source_rows (the dedup's row indices count it), without the names."""
        for _, split, row in self.source_rows(part, num_parts):
            yield split, row

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        for corpus in self.sources.values():
            yield from corpus.rows_partition(split, part, num_parts)

    @property
    def articles_seen(self) -> dict[str, int]:
        """Articles per split of the last read, when every source is made of articles (else none)."""
        seen: list[dict[str, int]] = [getattr(c, "articles_seen", None) or {} for c in self.sources.values()]
        if not all(seen):
            return {}
        return {split: sum(s.get(split, 0) for s in seen) for split in SPLITS if any(split in s for s in seen)}

    def manifest_sources(self) -> list[dict]:
        """What the manifest says of each source: its name, kind and credit (its weight is the run's)."""
        return [{"name": n, "source": self.settings[n].source, "credit": c.credit} for n, c in self.sources.items()]
