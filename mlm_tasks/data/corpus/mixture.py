"""Several text sources as one corpus (corpus.source: mixture), read in name order: the shard writer keeps each
source's shards apart, training draws from them by weight (not in the fingerprint). docs/data.md#mixtures
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from mlm_tasks.config import CorpusConfig
from mlm_tasks.data.corpus.base import Corpus

# Settings that change a source's rows or splits but not its own fingerprint (data_fingerprint adds the
# single source's from corpus.*): the mixture's fingerprint carries each source's.
_ROW_SETTINGS = {"hf_dataset": ("text_column",), "local_files": ("text_column", "split_by", "document_column")}


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
                rows = {k: getattr(s, k) for k in _ROW_SETTINGS.get(s.source, ())}
                parts[name] = {"source": s.source, "fingerprint": corpus.fingerprint(), **rows}
            self._fingerprint = "mixture:" + json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return self._fingerprint

    def size_bytes(self) -> int | None:
        """The sources' sizes added (plan_shards' partition count); None when none is known."""
        sizes = [size for c in self.sources.values() if (size := c.size_bytes()) is not None]
        return sum(sizes) if sizes else None

    def partition_units(self) -> int | None:
        """Each partition reads its part of every source: as many get rows as the source with most units has."""
        units = [c.partition_units() for c in self.sources.values()]
        return None if any(u is None for u in units) else max(u for u in units if u is not None)

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

    def manifest_sources(self) -> list[dict]:
        """What the manifest says of each source: its name, kind and credit (its weight is the run's)."""
        return [{"name": n, "source": self.settings[n].source, "credit": c.credit} for n, c in self.sources.items()]
