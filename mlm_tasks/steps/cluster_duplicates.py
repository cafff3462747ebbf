"""Step cluster_duplicates: join every bucket's pairs into clusters and mark the rows the writer skips.
python -m mlm_tasks cluster_duplicates --config c.yaml --set shards.partitions=4 --data-fingerprint FP"""

from __future__ import annotations

from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext


def cluster_duplicates(cfg: PipelineConfig, ctx: RunContext, *, num_parts: int = 1) -> dict[str, Any]:
    from mlm_tasks.data.dedup.clusters import cluster_duplicates as cluster

    return cluster(cfg, ctx.data, num_parts)
