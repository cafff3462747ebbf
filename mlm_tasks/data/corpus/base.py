"""The corpus interface (rows per split, a content fingerprint, a credit), the deterministic split of a row or
title, and the error for a corpus without text.

    class MySource(Corpus): ...    # fingerprint(), and rows_partition() or split_rows()
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
        """The rows of `split` in partition `part` of `num_parts`: every row lands in exactly one partition, and
        other partitions' rows are skipped before they are parsed. A source defines this or split_rows."""
        return (row for row_split, row in self.split_rows(part, num_parts) if row_split == split)

    def split_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str]]:
        """(split, row) for every row of partition `part`, each split's in rows_partition's order; a source
        that splits by a hash of the text reads itself once for all splits."""
        for split in SPLITS:
            for row in self.rows_partition(split, part, num_parts):
                yield split, row

    def source_rows(self, part: int = 0, num_parts: int = 1) -> Iterator[tuple[str, str, str]]:
        """(source, split, row): split_rows' stream, each row with its mixture source's name ("" for one source)."""
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
    """A train split without text rows, found by whichever reads it first."""
    return ConfigError(
        "The corpus is empty: its train split has no text rows. Check the corpus source settings "
        "(paths, dataset name, text_column)."
    )
