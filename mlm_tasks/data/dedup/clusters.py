"""Stage 3, once: the pairs of every bucket joined into clusters; every row but a cluster's smallest id goes.

stats = cluster_duplicates(cfg, paths, num_parts)   # dedup/clusters/pPPPPP-of-NNNNN.npy, clusters.json last
for source, split, row in kept_source_rows(corpus, paths, part, num_parts): ...   # what the writer reads
rows, stats = tokenizer_sample(paths, num_parts, budget_bytes)   # the tokenizer's text, by ascending row hash
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.dedup.matches import PAIR_DTYPE, matches_uri
from mlm_tasks.data.dedup.scan import load_array, load_scan, parts_and_indexes, save_array, scan_dir, split_ranks
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import SPLITS, DataPaths, join

log = logging.getLogger(__name__)


def clusters_marker(paths: DataPaths) -> str:
    return join(paths.dedup_dir, "clusters", "clusters.json")


def removed_uri(paths: DataPaths, part: int, num_parts: int) -> str:
    return join(paths.dedup_dir, "clusters", f"p{part:05d}-of-{num_parts:05d}.npy")


def _roots(pairs: np.ndarray) -> dict[int, int]:
    """Union-find over near (and exact) pairs: each row's cluster root, the cluster's smallest id."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for row, kept in zip(pairs["row"].tolist(), pairs["kept"].tolist(), strict=True):
        a, b = find(row), find(kept)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {x: find(x) for x in parent}


def _mark(masks: list[np.ndarray], ids: np.ndarray) -> None:
    """Set the bits of `ids` in their partitions' packed masks (np.packbits order: the first row is 0x80)."""
    parts, indexes = parts_and_indexes(ids)
    for part in np.unique(parts).tolist():
        rows = indexes[parts == part]
        np.bitwise_or.at(masks[part], rows >> 3, (0x80 >> (rows & 7)).astype(np.uint8))


def is_set(masks: list[np.ndarray], part: int, index: int) -> bool:
    """Whether row `index` of partition `part` has its bit set in the packed masks."""
    return bool(masks[part][index >> 3] & (0x80 >> (index & 7)))


def _count_by_split(counts: dict[str, int], ids: np.ndarray) -> None:
    for rank, count in enumerate(np.bincount(split_ranks(ids), minlength=len(SPLITS))):
        counts[SPLITS[rank]] += int(count)


def cluster_duplicates(cfg: PipelineConfig, paths: DataPaths, num_parts: int) -> dict[str, Any]:
    marker = clusters_marker(paths)
    if (done := storage.read_json_if_exists(marker)) is not None:
        return done
    t0 = time.time()
    scans = [load_scan(paths, part, num_parts) for part in range(num_parts)]
    # Per partition, a bit per row (packed): not written (filtered, or removed); an exact copy.
    masks = [load_array(join(scan_dir(paths, part, num_parts), "dropped.npy")) for part in range(num_parts)]
    exact = [np.zeros_like(mask) for mask in masks]
    # A bucket at a time: exact pairs point at their group's smallest id already, so their rows are marked as
    # they come; only near pairs (far fewer) are kept for the union-find, not every pair of the corpus.
    near, pairs = [], 0
    removed = {"exact": dict.fromkeys(SPLITS, 0), "near": dict.fromkeys(SPLITS, 0)}
    for bucket in range(num_parts):
        if not storage.exists(matches_uri(paths, bucket)):
            raise MissingArtifactError(
                f"Bucket {bucket} of {num_parts} is not matched: rerun its find_duplicates task, then this one."
            )
        found = load_array(matches_uri(paths, bucket))
        pairs += len(found)
        copies = np.unique(found["row"][found["exact"] == 1])
        _mark(exact, copies)
        _count_by_split(removed["exact"], copies)
        near.append(found[found["exact"] == 0])
    near_pairs = np.concatenate(near) if near else np.zeros(0, dtype=PAIR_DTYPE)
    if len(near_pairs):
        ids = np.array([row for row, root in _roots(near_pairs).items() if row != root], dtype=np.uint64)
        parts, indexes = parts_and_indexes(ids)
        fresh = ids[[not is_set(exact, p, i) for p, i in zip(parts.tolist(), indexes.tolist(), strict=True)]]
        _count_by_split(removed["near"], fresh)
        _mark(masks, ids)
    for part, (mask, copy) in enumerate(zip(masks, exact, strict=True)):
        save_array(removed_uri(paths, part, num_parts), mask | copy)
    filtered: Counter[str] = Counter()
    for scan in scans:
        filtered.update(scan["filtered"])
    stats = {
        "rows": {s: sum(scan["rows"][s] for scan in scans) for s in SPLITS},
        "dropped_by_filters": sum(scan["dropped_by_filters"] for scan in scans),
        "filters": dict(filtered),
        "duplicates_removed": removed,
        "pairs": pairs,
        "seconds": round(time.time() - t0, 1),
    }
    storage.write_json(marker, stats)  # last: marks the clusters done
    log.info(
        "Dedup: %d rows, %d dropped by filters, %d exact and %d near duplicates removed (%.1fs)",
        sum(stats["rows"].values()),
        stats["dropped_by_filters"],
        sum(removed["exact"].values()),
        sum(removed["near"].values()),
        stats["seconds"],
    )
    return stats


def removed_bits(paths: DataPaths, part: int, num_parts: int) -> np.ndarray:
    """The partition's mask packed, a bit per row (np.packbits order), as cluster_duplicates wrote it."""
    uri = removed_uri(paths, part, num_parts)
    if not storage.exists(uri):
        raise MissingArtifactError(
            f"No dedup result for partition {part} of {num_parts} ({uri}): run scan_partition, find_duplicates "
            "and cluster_duplicates first."
        )
    return load_array(uri)


def kept_rows(corpus, paths: DataPaths, part: int, num_parts: int) -> Iterator[tuple[str, str]]:
    """(split, row) of the partition's rows that the filters and the dedup kept, in stream order."""
    for _, split, row in kept_source_rows(corpus, paths, part, num_parts):
        yield split, row


def kept_source_rows(corpus, paths: DataPaths, part: int, num_parts: int) -> Iterator[tuple[str, str, str]]:
    """(source, split, row) of the kept rows: the same stream, each row with its mixture source's name."""
    scan = load_scan(paths, part, num_parts, todo="run scan_partition first")
    removed = np.unpackbits(removed_bits(paths, part, num_parts), count=sum(scan["rows"].values())).astype(bool)
    index = -1
    for index, (source, split, row) in enumerate(corpus.source_rows(part, num_parts)):
        if index >= len(removed):
            break
        if not removed[index]:
            yield source, split, row
    if index + 1 != len(removed):
        raise ConfigError(
            f"Partition {part} of {num_parts} has {'more' if index + 1 > len(removed) else 'fewer'} rows now than "
            f"the {len(removed)} it had when it was scanned: the corpus changed under this shard set. Delete "
            f"{paths.root} and rerun the shard set."
        )


def tokenizer_sample(paths: DataPaths, num_parts: int, budget: int) -> tuple[list[str], dict]:
    """The tokenizer's training text: the kept train rows with the smallest row hashes that fit `budget` bytes."""
    removed = [removed_bits(paths, part, num_parts) for part in range(num_parts)]  # a bit per row of the corpus
    rows: list[str] = []
    taken = candidates = 0
    last = None
    with tempfile.TemporaryDirectory(prefix="mlm-tokenizer-sample-") as tmp:
        streams = []
        for part in range(num_parts):
            local = os.path.join(tmp, f"{part}.jsonl")
            storage.copy_to_local(join(scan_dir(paths, part, num_parts), "sample.jsonl"), local)
            streams.append(_candidates(local, part))
        for h, part, index, row in heapq.merge(*streams):
            candidates += 1
            if is_set(removed, part, index) or h == last:  # removed by the dedup, or a copy already taken
                continue
            size = len(row.encode("utf-8"))
            if taken + size > budget and rows:
                break
            rows.append(row)
            taken, last = taken + size, h
    return rows, {"rows": len(rows), "bytes": taken, "budget_bytes": budget, "candidates_read": candidates}


def _candidates(path: str, part: int) -> Iterator[tuple[int, int, int, str]]:
    with open(path, encoding="utf-8") as f:
        for h, index, row in map(json.loads, f):
            yield h, part, index, row
