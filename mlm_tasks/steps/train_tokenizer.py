"""Step train_tokenizer: train on a seeded sample of the deduplicated rows, or reuse from_pretrained's or init_from's.
python -m mlm_tasks train_tokenizer --config c.yaml --set shards.partitions=4 --data-fingerprint FP"""

from __future__ import annotations

import logging
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext, join

log = logging.getLogger(__name__)


def train_tokenizer(cfg: PipelineConfig, ctx: RunContext, *, num_parts: int = 1) -> dict[str, Any]:
    """What the tokenizer was trained on ({} with a reused tokenizer): rows, bytes, budget."""
    from mlm_tasks.base_model import tokenizer_ref
    from mlm_tasks.data.dedup.clusters import tokenizer_sample
    from mlm_tasks.data.shard_set import ensure_tokenizer

    paths = ctx.data
    if tokenizer_ref(cfg) is not None:
        ensure_tokenizer(cfg, None, paths)
        return {}
    recorded = storage.read_json_if_exists(paths.tokenizer_sample)
    if recorded is not None and storage.exists(join(paths.tokenizer, "tokenizer.json")):
        log.info("Reusing the tokenizer already trained for this fingerprint: %s", paths.tokenizer)
        return recorded
    rows, stats = tokenizer_sample(paths, num_parts, cfg.tokenizer.sample_mb * 1_000_000)
    log.info(
        "Tokenizer sample: %d rows, %.1f MB of the train split's deduplicated rows (budget %d MB, %d candidates read)",
        stats["rows"],
        stats["bytes"] / 1e6,
        cfg.tokenizer.sample_mb,
        stats["candidates_read"],
    )
    ensure_tokenizer(cfg, rows, paths)
    # What the data card keeps: the candidates read depend on the partition count, the sample does not.
    recorded = {k: stats[k] for k in ("rows", "bytes", "budget_bytes")}
    storage.write_json(paths.tokenizer_sample, recorded)
    return recorded
