"""Deduplication of a corpus too large for one task's memory, in three stages (datatrove's MinHash layout).

    scan_partition(cfg, paths, part, n)   # per partition (mapped): row keys into buckets, tokenizer candidates
    find_duplicates(cfg, paths, bucket, n)  # per bucket (mapped, one per partition): rows sharing a key, as pairs
    cluster_duplicates(cfg, paths)        # once: pairs joined into clusters, one row kept per cluster
    kept_rows(corpus, paths, part, n)     # what the shard writer reads: rows no filter dropped, one per cluster

The smallest RowId of a cluster is kept (a train copy when there is one). docs/data.md, Deduplication
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
