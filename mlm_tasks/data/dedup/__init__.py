"""Deduplication of a corpus too large for one task's memory, in three stages (datatrove's MinHash layout):
scan_partition (scan.py, per partition), find_duplicates (matches.py, per bucket), cluster_duplicates
(clusters.py, once: the smallest row id of a cluster, a train copy when there is one, is kept). docs/data.md
"""

from __future__ import annotations


def dedup_in_process(cfg, paths, corpus, num_parts: int) -> dict:
    """The three stages one after the other in this process (the DAG maps them); cluster_duplicates' counts."""
    from mlm_tasks.data.dedup.clusters import cluster_duplicates
    from mlm_tasks.data.dedup.matches import find_duplicates
    from mlm_tasks.data.dedup.scan import scan_partition
    from mlm_tasks.data.filters import RowFilter

    row_filter = RowFilter(cfg.corpus.filters)
    for part in range(num_parts):
        scan_partition(cfg, paths, corpus, part, num_parts, row_filter)
    for bucket in range(num_parts):
        find_duplicates(cfg, paths, bucket, num_parts)
    return cluster_duplicates(cfg, paths, num_parts)
