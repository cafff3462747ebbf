"""Stage 3, once: the pairs of every bucket joined into clusters; every row but a cluster's smallest id goes.

    stats = cluster_duplicates(cfg, paths, num_parts)   # dedup/clusters/pPPPPP-of-NNNNN.npy, clusters.json last
    removed = removed_rows(paths, part, num_parts)       # a bool per row of the partition's stream
    for split, row in kept_rows(corpus, paths, part, num_parts): ...   # what the shard writer reads

A partition's mask also carries the rows its scan's filters dropped, so the writer reads one mask.
Exact pairs all point at their group's smallest id already; only near pairs need the union-find.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.dedup.matches import PAIR_DTYPE, matches_uri
from mlm_tasks.data.dedup.row_ids import index_of_id, part_of_id, split_of_id
from mlm_tasks.data.dedup.scan import load_array, save_array, scan_dir
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


def cluster_duplicates(cfg: PipelineConfig, paths: DataPaths, num_parts: int) -> dict[str, Any]:
    marker = clusters_marker(paths)
    done = storage.read_json_if_exists(marker)
    if done is not None:
        return done
    t0 = time.time()
    scans = []
    for part in range(num_parts):
        scan = storage.read_json_if_exists(join(scan_dir(paths, part, num_parts), "scan.json"))
        if scan is None:
            raise MissingArtifactError(
                f"Partition {part} of {num_parts} is not scanned: rerun its scan_partition task, then this one."
            )
        scans.append(scan)
    found = []
    for bucket in range(num_parts):
        if not storage.exists(matches_uri(paths, bucket)):
            raise MissingArtifactError(
                f"Bucket {bucket} of {num_parts} is not matched: rerun its find_duplicates task, then this one."
            )
        found.append(load_array(matches_uri(paths, bucket)))
    pairs = np.concatenate(found) if found else np.zeros(0, dtype=PAIR_DTYPE)
    exact_rows = set(pairs["row"][pairs["exact"] == 1].tolist())
    if (pairs["exact"] == 1).all():  # exact pairs point at their group's smallest id already
        removed_ids = exact_rows
    else:
        removed_ids = {row for row, root in _roots(pairs).items() if row != root}
    masks = []
    for part, scan in enumerate(scans):
        n = sum(scan["rows"].values())
        dropped = np.unpackbits(load_array(join(scan_dir(paths, part, num_parts), "dropped.npy")), count=n).astype(bool)
        masks.append(dropped)
    removed = {"exact": dict.fromkeys(SPLITS, 0), "near": dict.fromkeys(SPLITS, 0)}
    for rid in removed_ids:
        part, index = part_of_id(rid), index_of_id(rid)
        masks[part][index] = True
        removed["exact" if rid in exact_rows else "near"][split_of_id(rid)] += 1
    for part, mask in enumerate(masks):
        save_array(removed_uri(paths, part, num_parts), np.packbits(mask))
    filtered: dict[str, int] = {}
    for scan in scans:
        for rule, count in scan["filtered"].items():
            filtered[rule] = filtered.get(rule, 0) + count
    stats = {
        "rows": {s: sum(scan["rows"][s] for scan in scans) for s in SPLITS},
        "dropped_by_filters": sum(scan["dropped_by_filters"] for scan in scans),
        "filters": filtered,
        "duplicates_removed": removed,
        "pairs": len(pairs),
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


def removed_rows(paths: DataPaths, part: int, num_parts: int) -> np.ndarray:
    """The partition's mask, a bool per row of its stream (True: not written)."""
    uri = removed_uri(paths, part, num_parts)
    scan = storage.read_json_if_exists(join(scan_dir(paths, part, num_parts), "scan.json"))
    if scan is None or not storage.exists(uri):
        raise MissingArtifactError(
            f"No dedup result for partition {part} of {num_parts} ({uri}): run scan_partition, find_duplicates "
            "and cluster_duplicates first."
        )
    return np.unpackbits(load_array(uri), count=sum(scan["rows"].values())).astype(bool)


def kept_rows(corpus, paths: DataPaths, part: int, num_parts: int) -> Iterator[tuple[str, str]]:
    """(split, row) of the partition's rows that the filters and the dedup kept, in stream order."""
    removed = removed_rows(paths, part, num_parts)
    index = -1
    for index, (split, row) in enumerate(corpus.split_rows(part, num_parts)):
        if index >= len(removed):
            break
        if not removed[index]:
            yield split, row
    if index + 1 != len(removed):
        raise ConfigError(
            f"Partition {part} of {num_parts} has {'more' if index + 1 > len(removed) else 'fewer'} rows now than "
            f"the {len(removed)} it had when it was scanned: the corpus changed under this shard set. Delete "
            f"{paths.root} and rerun the shard set."
        )
