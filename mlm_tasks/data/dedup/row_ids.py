"""Row ids (uint64: split rank, partition, index in its stream; the rank in the top bits, so the smallest id
of a group of copies is a train copy when one exists) and row hashes (the exact-dedup key).
"""

from __future__ import annotations

import hashlib

import numpy as np

from mlm_tasks.paths import SPLITS

_PART_SHIFT, _RANK_SHIFT = 40, 60  # index: 40 bits (10^12 rows a partition), part: 20 bits, rank: 2 bits

# One record per row key: the key (exact hash or LSH band), the row, and whether the key is exact.
KEY_DTYPE = np.dtype([("key", "<u8"), ("row", "<u8"), ("exact", "u1")])


def row_id(split: str, part: int, index: int) -> int:
    return (SPLITS.index(split) << _RANK_SHIFT) | (part << _PART_SHIFT) | index


def split_ranks(ids: np.ndarray) -> np.ndarray:
    """The SPLITS index of each id."""
    return (ids >> np.uint64(_RANK_SHIFT)).astype(np.int64)


def parts_and_indexes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The partition and the index in its stream of each id."""
    parts = (ids >> np.uint64(_PART_SHIFT)) & np.uint64((1 << (_RANK_SHIFT - _PART_SHIFT)) - 1)
    return parts.astype(np.int64), (ids & np.uint64((1 << _PART_SHIFT) - 1)).astype(np.int64)


def row_hash(row: str) -> int:
    return int.from_bytes(hashlib.blake2b(row.encode("utf-8"), digest_size=8).digest(), "little")
