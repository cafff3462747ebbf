"""Step check_run: check the run against its shard set (records, max_length, tokenizer, checkpoints) before compute.
python -m mlm_tasks check_run --config configs/tiny.yaml --run-id r1 [--data-fingerprint FP]"""

from __future__ import annotations

import logging

from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import load_manifest, source_weights
from mlm_tasks.model.roberta import model_vocab_size
from mlm_tasks.paths import RunContext
from mlm_tasks.results import DataSummary, RunCheck
from mlm_tasks.training.plan import check_resumable, plan_lines, plan_steps, planned_replicas

log = logging.getLogger(__name__)


def check_run(cfg: PipelineConfig, ctx: RunContext, *, data: DataSummary) -> RunCheck:
    """Raises ConfigError for a run that does not fit `data` (merge_shards' summary)."""
    fingerprint = data["fingerprint"]
    shard_set = load_manifest(cfg, fingerprint)  # max_length and tokenizer of the shards
    for split in ("train", cfg.eval.split):
        shard_set.verify(split, checksums=False)  # missing or truncated shards; train() checks every sha256
    weights = source_weights(cfg, shard_set)  # a mixture: the run weighs exactly the set's sources
    if weights:
        log.info("Mixture weights: %s", ", ".join(f"{name} {w:g}" for name, w in weights.items()))
    # Per replica (the count is known only on the training host); train() checks the global batch again.
    steps = plan_steps(cfg, shard_set, cfg.train.batch_size)
    check_resumable(ctx.run, fingerprint, model_vocab_size(cfg, shard_set.vocab_size))
    log.info(
        "Run %s fits data %s: %d train records, batch %d per replica, %d steps at one replica.",
        ctx.run_id,
        fingerprint,
        shard_set.records("train"),
        cfg.train.batch_size,
        steps,
    )
    replicas = planned_replicas(cfg)
    planned = plan_steps(cfg, shard_set, cfg.train.batch_size * replicas) if replicas > 1 else steps
    base = data.get("base_model")  # model.init_from: the shape is the base's
    dims = {**base, "vocab_size": shard_set.vocab_size} if base else None
    plan = plan_lines(cfg, planned, model_vocab_size(cfg, shard_set.vocab_size), dims, replicas)
    for line in plan:
        log.info(line)
    return RunCheck(fingerprint=fingerprint, train_records=shard_set.records("train"), steps=steps, plan=plan)
