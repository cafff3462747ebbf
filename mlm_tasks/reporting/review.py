"""What a person reads before approving a release (`publish.require_approval`): one Markdown page, the body
of Airflow's approval form (plugins/mlm_airflow/operators/release_approval.py).

    body = review_markdown(cfg, ctx.run, decision)           # reads the run's artifacts and the published metrics
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths
from mlm_tasks.reporting.card import read_run_artifacts
from mlm_tasks.reporting.gate import previous_published
from mlm_tasks.reporting.tables import downstream_table, section
from mlm_tasks.results import GateDecision

MISSING = "–"


def _num(value: Any, fmt: str = "{:.4f}") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return MISSING
    return fmt.format(value)


def _perplexity(loss: Any) -> Any:
    # exp() of a large untrained loss overflows; show it as infinite rather than fail the form.
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return math.exp(loss) if loss < 700 else math.inf
    return None


def _metrics_table(metrics: Mapping[str, Any] | None, previous: Mapping[str, Any] | None) -> list[str]:
    if not metrics:
        return ["No eval metrics for this run (evaluate did not write eval/metrics.json)."]
    get, prev = metrics.get, (previous or {}).get
    rows = [
        ("loss", get("loss"), get("untrained_loss"), None, prev("loss")),
        ("perplexity", get("perplexity"), _perplexity(get("untrained_loss")), None, prev("perplexity")),
        (
            "masked-token accuracy",
            get("accuracy"),
            get("untrained_accuracy"),
            get("baseline_accuracy"),
            prev("accuracy"),
        ),
    ]
    lines = ["| metric | this run | untrained model | unigram baseline | last published |", "|---|---|---|---|---|"]
    lines += [
        f"| {name} | {_num(run)} | {_num(untrained)} | {_num(baseline)} | {_num(published)} |"
        for name, run, untrained, baseline, published in rows
    ]
    return [
        *lines,
        "",
        f"Split `{get('split', MISSING)}`, {get('masked_tokens', MISSING)} masked tokens; "
        f"the baseline always predicts `{get('baseline_token', MISSING)}`.",
    ]


def _published_line(previous: Mapping[str, Any] | None, repo_id: str | None) -> str:
    if not repo_id:
        return "No `publish.repo_id`: nothing to compare with."
    if not previous:
        return f"Nothing published to `{repo_id}` from this output_root yet: this would be its first model."
    return (
        f"Last published to `{repo_id}`: run `{previous.get('run_id', MISSING)}`, commit "
        f"`{previous.get('commit_oid', MISSING)}` (its metrics are the table's last column)."
    )


def _validation_lines(summary: Mapping[str, Any] | None) -> list[str]:
    if not summary:
        return ["No training summary (train/summary.json)."]
    if summary.get("best_val_loss") is None and summary.get("val_loss") is None:
        return ["No validation during training (`train.eval_every` is off)."]
    return [
        f"- best: {_num(summary.get('best_val_loss'))} at step {summary.get('best_step', MISSING)}",
        f"- last: {_num(summary.get('val_loss'))} (the saved model is the {summary.get('kept', 'last')} step's)",
    ]


def review_markdown(cfg: PipelineConfig, run: RunPaths, decision: GateDecision) -> str:
    """The review page of `run`, from its artifacts and the metrics last published to `publish.repo_id`."""
    art, previous, repo_id = read_run_artifacts(run), previous_published(cfg), cfg.publish.repo_id
    visibility = "private" if cfg.publish.private else "public"
    return "\n".join(
        [
            f"The model of run `{run.run_id}` would be pushed to `{repo_id or MISSING}`, a {visibility} repo.",
            "",
            *section("### Evaluation", _metrics_table(art["metrics"], previous)),
            *section(
                f"### Gate: {'passed' if decision.get('passed') else 'failed'}",
                [f"- {reason}" for reason in decision.get("reasons", [])],
            ),
            *section("### Last published model", [_published_line(previous, repo_id)]),
            *section("### Validation loss during training", _validation_lines(art["summary"])),
            *section("### Downstream tasks", downstream_table(art["downstream"])),
            f"Approve to publish; Reject to skip publishing (say why in the comment, it goes to the log). "
            f"No answer within {cfg.publish.approval_timeout_hours:g} h (`publish.approval_timeout_hours`) counts "
            "as a rejection.",
        ]
    )
