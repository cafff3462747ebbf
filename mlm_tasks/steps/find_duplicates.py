"""Step find_duplicates: the rows sharing a hash in one bucket (bucket b: partition b's task), from every scan.
python -m mlm_tasks find_duplicates --config c.yaml --set shards.partitions=4 --bucket 3 --data-fingerprint FP"""

from __future__ import annotations

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext


def find_duplicates(cfg: PipelineConfig, ctx: RunContext, *, bucket: int = 0, num_parts: int = 1) -> dict[str, int]:
    """The bucket and the duplicate pairs found in it (exact ones among them)."""
    from mlm_tasks.data.dedup.matches import find_duplicates as match

    pairs = match(cfg, ctx.data, bucket, num_parts)
    return {"bucket": bucket, "pairs": len(pairs), "exact_pairs": int(pairs["exact"].sum())}
