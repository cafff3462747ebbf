"""Stage 2, per bucket: the rows that share a key, from every partition's scan of this bucket.
A pair is (row, kept, exact): `row` shares a key with `kept`, the smallest id of its key's group.

    pairs = find_duplicates(cfg, paths, bucket, num_parts)   # dedup/matches/bBBBBB.npy, PAIR_DTYPE
"""

from __future__ import annotations

import logging

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.dedup.scan import KEY_DTYPE, bucket_uri, load_array, load_scan, save_array
from mlm_tasks.paths import DataPaths, join

log = logging.getLogger(__name__)

PAIR_DTYPE = np.dtype([("row", "<u8"), ("kept", "<u8"), ("exact", "u1")])


def matches_uri(paths: DataPaths, bucket: int) -> str:
    return join(paths.dedup_dir, "matches", f"b{bucket:05d}.npy")


def pairs_in(records: np.ndarray) -> np.ndarray:
    """(row, kept, exact) for every record whose key an earlier (smaller) row id also has."""
    if not len(records):
        return np.zeros(0, dtype=PAIR_DTYPE)
    records = np.sort(records, order=["key", "row"])
    starts = np.r_[True, records["key"][1:] != records["key"][:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(len(records)), 0))  # each record's group start
    kept = records["row"][first]
    mask = records["row"] != kept  # the same row twice under one key (two equal bands) is no pair
    pairs = np.zeros(int(mask.sum()), dtype=PAIR_DTYPE)
    pairs["row"], pairs["kept"], pairs["exact"] = records["row"][mask], kept[mask], records["exact"][mask]
    return np.unique(pairs)  # a near pair found by several bands counts once


def find_duplicates(cfg: PipelineConfig, paths: DataPaths, bucket: int, num_parts: int) -> np.ndarray:
    out = matches_uri(paths, bucket)
    if storage.exists(out):
        log.info("Bucket %d already matched (%s)", bucket, out)
        return load_array(out)
    parts = []
    for part in range(num_parts):
        load_scan(paths, part, num_parts)
        parts.append(load_array(bucket_uri(paths, part, num_parts, bucket)).astype(KEY_DTYPE))
    records = np.concatenate(parts) if parts else np.zeros(0, dtype=KEY_DTYPE)
    pairs = pairs_in(records)
    save_array(out, pairs)
    log.info(
        "Bucket %d of %d: %d keys, %d duplicate pairs (%d exact)",
        bucket + 1,
        num_parts,
        len(records),
        len(pairs),
        int(pairs["exact"].sum()),
    )
    return pairs
