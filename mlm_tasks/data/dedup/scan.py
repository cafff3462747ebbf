"""Stage 1, per partition: each row's keys into buckets, the rows the filters drop, tokenizer candidates.
Writes bBBBBB.npy per bucket (KEY_DTYPE records), dropped.npy (a bit per row), sample.jsonl, scan.json last.

    scan = scan_partition(cfg, paths, corpus, part, num_parts, row_filter)   # dedup/scans/pPPPPP-of-NNNNN/
"""

from __future__ import annotations

import hashlib
import heapq
import io
import json
import logging
import time
from typing import Any

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.dedup.near_keys import NearKeys
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import SPLITS, DataPaths, join

log = logging.getLogger(__name__)

NEAR_BATCH = 512  # rows per MinHash.bulk call
# A row id (uint64): split rank, partition, index in the partition's stream. The rank is in the top bits, so the
# smallest id of a group of copies is a train copy when one exists.
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
    """A 64-bit hash of a row's text: the exact-dedup key."""
    return int.from_bytes(hashlib.blake2b(row.encode("utf-8"), digest_size=8).digest(), "little")


def scan_dir(paths: DataPaths, part: int, num_parts: int) -> str:
    return join(paths.dedup_dir, "scans", f"p{part:05d}-of-{num_parts:05d}")


def bucket_uri(paths: DataPaths, part: int, num_parts: int, bucket: int) -> str:
    return join(scan_dir(paths, part, num_parts), f"b{bucket:05d}.npy")


def load_scan(paths: DataPaths, part: int, num_parts: int, todo: str = "rerun its scan_partition task, then this one"):
    """The partition's scan.json; MissingArtifactError saying `todo` when it is not scanned yet."""
    scan = storage.read_json_if_exists(join(scan_dir(paths, part, num_parts), "scan.json"))
    if scan is None:
        raise MissingArtifactError(f"Partition {part} of {num_parts} is not scanned: {todo}.")
    return scan


def save_array(uri: str, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    storage.write_bytes(uri, buf.getvalue())


def load_array(uri: str) -> np.ndarray:
    return np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)


class SampleCandidates:
    """A partition's train rows with the smallest hashes whose text fits in `budget` bytes, and the first one
    that does not (copies counted once): whatever the partition count, the corpus's sample is among them."""

    def __init__(self, budget: int):
        self.budget, self.bytes = budget, 0
        self.heap: list[tuple[int, int, str]] = []  # (-hash, index, row): the largest hash on top
        self.hashes: set[int] = set()

    def _over(self) -> int:
        """Bytes over the budget without the largest-hash row (> 0: that row is not needed to end the sample)."""
        return self.bytes - len(self.heap[0][2].encode("utf-8")) - self.budget

    def offer(self, h: int, index: int, row: str) -> None:
        if h in self.hashes or (self.bytes > self.budget and h > -self.heap[0][0]):
            return
        heapq.heappush(self.heap, (-h, index, row))
        self.hashes.add(h)
        self.bytes += len(row.encode("utf-8"))
        while len(self.heap) > 1 and self._over() > 0:
            neg, _, dropped = heapq.heappop(self.heap)
            self.hashes.discard(-neg)
            self.bytes -= len(dropped.encode("utf-8"))

    def lines(self) -> bytes:
        """JSON lines by ascending hash, encoded one at a time (the sample is the scan's largest object)."""
        out = io.BytesIO()
        for neg, index, row in sorted(self.heap, reverse=True):
            out.write(json.dumps([-neg, index, row], ensure_ascii=False).encode("utf-8") + b"\n")
        return out.getvalue()


def scan_partition(
    cfg: PipelineConfig, paths: DataPaths, corpus, part: int, num_parts: int, row_filter=None
) -> dict[str, Any]:
    """Scan partition `part` once (a scanned partition is read back, not rescanned)."""
    out = scan_dir(paths, part, num_parts)
    marker = join(out, "scan.json")
    if (done := storage.read_json_if_exists(marker)) is not None:
        log.info("Partition %d/%d already scanned (%s)", part + 1, num_parts, marker)
        return done
    dc, t0 = cfg.dedup, time.time()
    near = NearKeys(dc) if dc.near else None
    keys: list[tuple[int, int, int]] = []
    dropped: list[bool] = []
    rows = {s: 0 for s in SPLITS}
    sample = SampleCandidates(cfg.tokenizer.sample_mb * 1_000_000)
    pending: list[tuple[int, str]] = []  # (row id, row) awaiting a MinHash batch

    def flush_near(near: NearKeys) -> None:
        for (rid, _), band_keys in zip(pending, near.of_batch([r for _, r in pending]), strict=True):
            keys.extend((k, rid, 0) for k in band_keys)
        pending.clear()

    for index, (split, row) in enumerate(corpus.split_rows(part, num_parts)):
        rows[split] += 1
        drop = row_filter is not None and row_filter.reason(row) is not None
        dropped.append(drop)
        if drop:
            continue
        rid, h = row_id(split, part, index), row_hash(row)
        if dc.exact:
            keys.append((h, rid, 1))
        if near is not None:
            pending.append((rid, row))
            if len(pending) >= NEAR_BATCH:
                flush_near(near)
        if split == "train":
            sample.offer(h, index, row)
        if index and index % 100_000 == 0:
            rate = index / (time.time() - t0)
            log.info("Partition %d/%d: %d rows scanned (%.0f rows/s)", part + 1, num_parts, index, rate)
    if near is not None and pending:
        flush_near(near)
    records = np.array(keys, dtype=KEY_DTYPE)
    for bucket in range(num_parts):  # as many buckets as partitions: each match holds ~one partition's keys
        save_array(bucket_uri(paths, part, num_parts, bucket), records[records["key"] % num_parts == bucket])
    save_array(join(out, "dropped.npy"), np.packbits(np.array(dropped, dtype=bool)))
    storage.write_bytes(join(out, "sample.jsonl"), sample.lines())
    scan = {
        "part": part,
        "num_parts": num_parts,
        "rows": rows,
        "filtered": dict(row_filter.counts) if row_filter is not None else {},
        "dropped_by_filters": int(sum(dropped)),
        "keys": len(records),
        "sample_candidates": {"rows": len(sample.heap), "bytes": sample.bytes},
        "seconds": round(time.time() - t0, 1),
    }
    storage.write_json(marker, scan)  # last: marks this partition scanned
    log.info(
        "Partition %d/%d scanned: %d rows, %d dropped by filters, %d keys in %d buckets, %.1fs",
        part + 1,
        num_parts,
        sum(rows.values()),
        scan["dropped_by_filters"],
        len(records),
        num_parts,
        scan["seconds"],
    )
    return scan
