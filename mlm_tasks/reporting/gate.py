"""The release gate's rules (docs/releases.md): may this run's model be published? Every configured check must
pass; each reason names the rule that decided.

    decision = evaluate_gate(metrics, cfg.gate, previous_published(cfg), downstream, cfg.downstream)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mlm_tasks import paths, storage
from mlm_tasks.config import DownstreamConfig, GateConfig, PipelineConfig
from mlm_tasks.results import GateDecision

# A rerun of the same model reproduces its metrics only up to float noise: that must not count as "worse".
REL_TOLERANCE = 1e-6
ABS_TOLERANCE = 1e-9


def _number(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    value = (metrics or {}).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _slack(reference: float) -> float:
    return max(ABS_TOLERANCE, REL_TOLERANCE * abs(reference))


def evaluate_gate(
    metrics: Mapping[str, Any],
    gate: GateConfig,
    previous: Mapping[str, Any] | None,
    downstream: Mapping[str, Any] | None = None,
    downstream_cfg: DownstreamConfig | None = None,
) -> GateDecision:
    """Check `metrics` (eval/metrics.json) and `downstream` (eval/downstream.json) against the thresholds
    and the previously published metrics."""
    failed: list[str] = []
    passed: list[str] = []
    loss, accuracy = _number(metrics, "loss"), _number(metrics, "accuracy")
    for value, name, setting, limit, sign, bad, good in (
        (loss, "eval loss", "gate.max_eval_loss", gate.max_eval_loss, 1, "is above", "is within"),
        (accuracy, "masked accuracy", "gate.min_accuracy", gate.min_accuracy, -1, "is below", "meets"),
    ):
        if limit is None:
            continue
        if value is None:
            failed.append(f"{name} is missing or NaN: run evaluate before the gate.")
        else:
            worse = sign * (value - limit) > 0
            (failed if worse else passed).append(f"{name} {value:.4f} {bad if worse else good} {setting} {limit:.4f}.")

    if gate.require_better_than_published and not previous:
        passed.append("no previously published model to compare with.")
    elif gate.require_better_than_published and previous:
        where = _where(previous)
        for value, name, key, sign in ((loss, "eval loss", "loss", 1), (accuracy, "masked accuracy", "accuracy", -1)):
            prev = _number(previous, key)
            if prev is None:
                continue
            if value is None:
                failed.append(
                    f"{name} is missing, so it cannot be compared with the previously published {prev:.4f}{where}."
                )
            elif sign * (value - prev) > _slack(prev):
                failed.append(f"{name} {value:.4f} is worse than the previously published {prev:.4f}{where}.")
            else:
                passed.append(f"{name} {value:.4f} is not worse than the previously published {prev:.4f}.")

    if downstream_cfg is not None:
        _downstream_minimums(downstream, downstream_cfg, failed, passed)
        if gate.require_better_than_published and previous and previous.get("downstream"):
            _downstream_vs_previous(downstream, downstream_cfg, previous, failed, passed)

    if not failed and not passed:
        passed.append("no gate checks configured.")
    warnings = [w for t in (downstream or {}).get("tasks", []) for w in t.get("warnings", [])]
    return {"passed": not failed, "reasons": failed + passed, "warnings": warnings}


def _where(previous: Mapping[str, Any]) -> str:
    return f" (run {previous['run_id']})" if previous.get("run_id") else ""


def _scores_by_task(downstream: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {t["name"]: t for t in (downstream or {}).get("tasks", [])}


def _downstream_minimums(
    downstream: Mapping[str, Any] | None, cfg: DownstreamConfig, failed: list[str], passed: list[str]
) -> None:
    scores = _scores_by_task(downstream)
    for task in cfg.tasks:
        minimum = cfg.min_score(task)
        if minimum is None:
            continue
        entry = scores.get(task.name)
        mean = _number((entry or {}).get("pretrained"), "mean")
        if entry is None or mean is None:
            failed.append(
                f"downstream {task.name}: no score to hold against its min_score {minimum:.4f}: run the "
                "downstream step before the gate."
            )
        elif mean < minimum:
            failed.append(
                f"downstream {task.name}: {entry['metric']} {mean:.4f} (mean of {len(entry['seeds'])} "
                f"seeds) is below its min_score {minimum:.4f}."
            )
        else:
            passed.append(f"downstream {task.name}: {entry['metric']} {mean:.4f} meets its min_score {minimum:.4f}.")


def _downstream_vs_previous(
    downstream: Mapping[str, Any] | None,
    cfg: DownstreamConfig,
    previous: Mapping[str, Any],
    failed: list[str],
    passed: list[str],
) -> None:
    """Only scores of the same task, metric and budget compare: another budget is another measurement."""
    where = _where(previous)
    for name, entry in _scores_by_task(downstream).items():
        prev = previous["downstream"].get(name)
        mean, prev_mean = _number(entry.get("pretrained"), "mean"), _number(prev, "mean")
        if prev is None or prev_mean is None:
            continue
        if prev.get("metric") != entry["metric"] or prev.get("budget") != entry["budget"]:
            passed.append(
                f"downstream {name}: not compared with the previously published model{where}: its metric "
                "or fine-tuning budget differs."
            )
            continue
        if mean is None:
            failed.append(f"downstream {name}: no score to compare with the previously published {prev_mean:.4f}.")
            continue
        diff, lo, hi, rule = _difference(entry, prev, mean, prev_mean)
        said = (
            f"downstream {name}: {entry['metric']} {mean:.4f} against the previously published {prev_mean:.4f}{where}, "
            f"difference {diff:+.4f}, 95% interval [{lo:+.4f}, {hi:+.4f}] ({rule})"
        )
        if hi < -cfg.max_regression - _slack(prev_mean):
            failed.append(f"{said}: worse by more than downstream.max_regression {cfg.max_regression:g}, beyond noise.")
        elif lo > 0:
            passed.append(f"{said}: better, beyond noise.")
        elif hi < 0:
            passed.append(f"{said}: lower, but within downstream.max_regression {cfg.max_regression:g}.")
        else:
            passed.append(f"{said}: equal within noise.")


def _difference(
    entry: Mapping[str, Any], prev: Mapping[str, Any], mean: float, prev_mean: float
) -> tuple[float, float, float, str]:
    """candidate - published, its 95% interval and the rule that gave it: paired where both scored the same
    examples and kept their predictions; from the two intervals where only those exist; else the means alone."""
    from mlm_tasks.downstream.uncertainty import paired_difference, unpaired_difference

    ours = entry["pretrained"]
    predictions = [r["predictions"] for r in ours.get("runs", []) if "predictions" in r]
    fingerprint = entry.get("validation_fingerprint")
    if predictions and prev.get("predictions") and fingerprint and prev.get("validation_fingerprint") == fingerprint:
        num_labels = 1 if entry.get("regression") else len(entry["labels"])
        diff, lo, hi = paired_difference(
            entry["metric"], predictions, prev["predictions"], entry["validation_labels"], num_labels
        )
        n = len(entry["validation_labels"])
        return diff, lo, hi, f"paired bootstrap over the same {n} examples and both models' seeds"
    if ours.get("interval") and prev.get("interval"):
        diff, lo, hi = unpaired_difference(mean, ours["interval"], prev_mean, prev["interval"])
        return diff, lo, hi, "from the two scores' intervals: not scored on the same examples"
    diff = mean - prev_mean
    return diff, diff, diff, "means alone: the published score has no interval"


def previous_published(cfg: PipelineConfig) -> dict | None:
    """Metrics of the model last published to `publish.repo_id`, or None if none was."""
    if not cfg.publish.repo_id:
        return None
    return storage.read_json_if_exists(
        paths.published_metrics(cfg.output_root, cfg.publish.repo_id, cfg.publish.releases_root)
    )
