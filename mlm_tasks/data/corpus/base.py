"""The corpus interface: what every source gives (rows per split, a content fingerprint, a credit).

    class MySource(Corpus): ...    # fingerprint() and rows_partition(split, part, num_parts)
                                   # size_bytes(), partition_units(): plan_shards sizes the fan-out by them
    for source, split, row in corpus.source_rows(part, num_parts): ...   # split_rows' stream, by source

Also what the text sources share: the deterministic split of a row or title, and the error for a
corpus without text. The sources are the other modules of this package; `open_corpus` in its __init__ picks one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS


class Corpus:
    """A source of rows per split with a content fingerprint."""

    credit: str = ""

    def fingerprint(self) -> str:
        raise NotImplementedError

    def size_bytes(self) -> int | None:
        """The bytes the source reads in all (plan_shards chooses the partition count from it); None:
        unknown, or more partitions would not cut each one's reading (a dump is read whole by each)."""
        return None

    def partition_units(self) -> int | None:
        """The most partitions that can each get rows (files, row groups, ranges of text); None: no limit known."""
        return None

    def rows(self, split: str) -> Iterator[str]:
        return self.rows_partition(split, 0, 1)

    def rows_partition(self, split: str, part: int, num_parts: int) -> Iterator[str]:
        """The rows of `split` in partition `part` of `num_parts`: every row of the source lands in
        exactly one partition, and other partitions' rows are skipped before they are parsed, so
        `num_parts` shard-writing tasks each do 1/num_parts of the work (mlm_tasks.data.writer)."""
        raise NotImplementedError

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """(split, row) for every row of partition `part`. Sources split by a hash of the text read
        the source once for all splits; the rows of each split come in the order rows_partition yields."""
        for split in SPLITS:
            for row in self.rows_partition(split, part, num_parts):
                yield split, row

    def source_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str, str]]:
        """(source, split, row): split_rows' stream, each row with the name of the mixture source it comes
        from ("" for a single source; mixture.MixtureCorpus names its sources)."""
        for split, row in self.split_rows(part, num_parts):
            yield "", split, row

    def source_names(self) -> list[str]:
        """The sources source_rows names, in stream order: [""] for a single source."""
        return [""]


def split_of(key: str, validation_fraction: float, test_fraction: float) -> str:
    """Deterministic split by a hash of `key` (an article title): stable across runs and machines."""
    u = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
    if u < validation_fraction:
        return "validation"
    if u < validation_fraction + test_fraction:
        return "test"
    return "train"


def empty_corpus_error() -> ConfigError:
    """A train split without text rows, found by whichever reads it first (validate, the tokenizer, the writer)."""
    return ConfigError(
        "The corpus is empty: its train split has no text rows. Check the corpus source settings "
        "(paths, dataset name, text_column)."
    )
