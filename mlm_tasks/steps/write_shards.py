"""Step write_shards: write one partition of the corpus as TFRecord shards, every split in one read.

    python -m mlm_tasks write_shards --config c.yaml --set shards.partitions=4 --part 0 --data-fingerprint FP

The DAGs run one task per partition of the plan (Airflow dynamic task mapping), on any worker that
sees output_root; the CLI writes the single partition of `shards.partitions=1` the same way.
The writer itself is mlm_tasks/data/writer.py.
"""
from __future__ import annotations

import logging
import time
from typing import TypedDict

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext

log = logging.getLogger(__name__)


class WrittenPartition(TypedDict):
    fingerprint: str
    part: int
    num_parts: int
    cache_hit: bool
    corpus_fingerprint: str | None
    records: dict[str, int]
    rows: dict[str, int]


def write_shards(cfg: PipelineConfig, ctx: RunContext, *, part: int = 0, num_parts: int = 1, cache_hit: bool = False,
                 corpus_fingerprint: str | None = None, corpus=None) -> WrittenPartition:
    """Write partition `part` of `num_parts` (0 parts: the set is complete, nothing to do) and its
    partial manifest; a small summary, which hands the plan on to merge_shards."""
    from mlm_tasks.data.writer import write_partition

    done = WrittenPartition(fingerprint=ctx.data.fingerprint, part=part, num_parts=num_parts, cache_hit=cache_hit,
                            corpus_fingerprint=corpus_fingerprint, records={}, rows={})
    if num_parts == 0:
        log.info("Nothing to write: the shard set %s is complete (or was brought as it is).", ctx.data.shards_dir)
        return done
    t0 = time.time()
    splits = write_partition(cfg, ctx.data, part, num_parts, corpus=corpus)["splits"]
    seconds = time.time() - t0
    tokens = sum(e["records"] for e in splits.values()) * cfg.shards.max_length
    log.info("Partition %d of %d: %s in %.1fs (%.0f tokens/s)", part + 1, num_parts,
             ", ".join(f"{s} {e['records']} records ({e['rows']} rows)" for s, e in splits.items()),
             seconds, tokens / max(seconds, 1e-9))
    done["records"] = {s: e["records"] for s, e in splits.items()}
    done["rows"] = {s: e["rows"] for s, e in splits.items()}
    return done
