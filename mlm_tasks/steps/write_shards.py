"""Step write_shards: write one partition of the corpus as TFRecord shards, every split in one read.
python -m mlm_tasks write_shards --config c.yaml --set shards.partitions=4 --part 0 --data-fingerprint FP"""

from __future__ import annotations

import logging
import time

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext
from mlm_tasks.results import WrittenPartition

log = logging.getLogger(__name__)


def write_shards(
    cfg: PipelineConfig, ctx: RunContext, *, part: int = 0, num_parts: int = 1, corpus=None
) -> WrittenPartition:
    """Write partition `part` of `num_parts` (one already written is kept); its records and rows per split."""
    from mlm_tasks.data.writer import write_partition

    t0 = time.time()
    splits = write_partition(cfg, ctx.data, part, num_parts, corpus=corpus)["splits"]
    seconds = time.time() - t0
    rate = sum(e["records"] for e in splits.values()) * cfg.shards.max_length / max(seconds, 1e-9)
    counts = ", ".join(f"{s} {e['records']} records ({e['rows']} rows)" for s, e in splits.items())
    log.info("Partition %d of %d: %s in %.1fs (%.0f tokens/s)", part + 1, num_parts, counts, seconds, rate)
    return WrittenPartition(
        fingerprint=ctx.data.fingerprint,
        part=part,
        num_parts=num_parts,
        records={s: e["records"] for s, e in splits.items()},
        rows={s: e["rows"] for s, e in splits.items()},
    )
