"""Step gate: may the trained model be published? The rules are mlm_tasks/reporting/gate.py's.
python -m mlm_tasks gate --config configs/default.yaml --run-id my-run"""

from __future__ import annotations

import logging

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.gate import evaluate_gate, previous_published
from mlm_tasks.results import GateDecision

log = logging.getLogger(__name__)


def gate(cfg: PipelineConfig, ctx: RunContext) -> GateDecision:
    """Read the run's eval metrics and the published ones, and decide; the reasons go to the log."""
    metrics = storage.read_json_if_exists(ctx.run.eval_metrics)
    if metrics is None:
        reasons = [f"No eval metrics at {ctx.run.eval_metrics}: run evaluate for this run first."]
        decision: GateDecision = {"passed": False, "reasons": reasons, "warnings": []}
    else:
        downstream = storage.read_json_if_exists(ctx.run.downstream)
        decision = evaluate_gate(metrics, cfg.gate, previous_published(cfg), downstream, cfg.downstream)
    log.info(
        "Evaluation gate %s:\n  %s", "passed" if decision["passed"] else "failed", "\n  ".join(decision["reasons"])
    )
    for warning in decision["warnings"]:  # not decisive: the approval page shows them to the reviewer
        log.warning("Gate warning: %s", warning)
    return decision
