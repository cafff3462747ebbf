"""Step summary: the end-of-run summary a person reads first, written to runs/<run>/summary.txt and logged.
python -m mlm_tasks summary --config configs/default.yaml --run-id r1 --data-fingerprint FP"""

from __future__ import annotations

import logging

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import DataSummary, summary_for_fingerprint
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.summary import summary_text
from mlm_tasks.results import RunSummary

log = logging.getLogger(__name__)


def summary(cfg: PipelineConfig, ctx: RunContext, *, data: DataSummary | None = None) -> RunSummary:
    """`data` is merge_shards' summary (read from ctx.fingerprint's shard set when not given)."""
    data = data or summary_for_fingerprint(cfg, ctx.data.fingerprint)
    run = ctx.run
    text = summary_text(run, ctx.with_data(data["fingerprint"]).data, data)
    storage.write_text(run.summary_text, text + "\n")
    log.info("Run summary:\n%s", text)
    train = storage.read_json_if_exists(run.train_summary) or {}
    metrics = storage.read_json_if_exists(run.eval_metrics) or {}
    return {"text": text, "train": train, "metrics": metrics, "data": data, "model_uri": run.model}
