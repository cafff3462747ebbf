"""The corpus interface: what every source gives (rows per split, a content fingerprint, a credit).

    class MySource(Corpus): ...    # fingerprint() and rows_partition(split, part, num_parts)

The sources are in mlm_tasks/corpus.py (text) and mlm_tasks/byo_shards.py (shards tokenized elsewhere);
`mlm_tasks.corpus.open_corpus(cfg)` picks one. Here alone, so those modules need not import each other.
"""
from __future__ import annotations

from collections.abc import Iterator

from mlm_tasks.paths import SPLITS


class Corpus:
    """A source of rows per split with a content fingerprint."""

    credit: str = ""

    def fingerprint(self) -> str:
        raise NotImplementedError

    def rows(self, split: str) -> Iterator[str]:
        return self.rows_partition(split, 0, 1)

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        """The rows of `split` in partition `part` of `num_parts`: every row of the source lands in
        exactly one partition, and other partitions' rows are skipped before they are parsed, so
        `num_parts` shard-writing tasks each do 1/num_parts of the work (mlm_tasks.shards_parallel)."""
        raise NotImplementedError

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """(split, row) for every row of partition `part`. Sources split by a hash of the text read
        the source once for all splits; the rows of each split come in the order rows_partition yields."""
        for split in SPLITS:
            for row in self.rows_partition(split, part, num_parts):
                yield split, row
