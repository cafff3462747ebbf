"""Step evaluate: the trained model's masked-LM loss, perplexity and accuracy; runs/<run>/eval/metrics.json.
python -m mlm_tasks evaluate --config configs/default.yaml --run-id my-run --data-fingerprint FP"""

from __future__ import annotations

import logging

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import RunContext
from mlm_tasks.results import EvalMetrics

log = logging.getLogger(__name__)


def evaluate(cfg: PipelineConfig, ctx: RunContext) -> EvalMetrics:
    """Score run `ctx.run_id`'s model on `eval.split` of shard set `ctx.fingerprint`; the metrics."""
    from mlm_tasks.training.evaluation import evaluate_model

    run = ctx.run
    if storage.exists(run.eval_metrics):
        log.info("Metrics already at %s: nothing to do", run.eval_metrics)
        return storage.read_json(run.eval_metrics)
    if not storage.exists(run.train_summary):
        raise MissingArtifactError(
            f"No trained model for run {ctx.run_id} ({run.train_summary} missing): run the train step first."
        )
    metrics = evaluate_model(cfg, ctx)
    storage.write_json(run.eval_metrics, metrics)
    return metrics
