"""Markdown sections and tables of the run report, the model card and the approval page; a missing piece is named.

lines = section("## Evaluation", metrics_table(metrics)) + downstream_table(downstream) + fill_mask_lines(predictions)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

METRIC_ROWS = [  # (key, label, format)
    ("loss", "Masked-LM loss (cross-entropy)", "{:.4f}"),
    ("perplexity", "Perplexity", "{:.2f}"),
    ("accuracy", "Masked-token accuracy", "{:.4f}"),
    ("baseline_accuracy", "Baseline accuracy (always the most frequent token)", "{:.4f}"),
    ("untrained_accuracy", "Untrained model accuracy", "{:.4f}"),
    ("untrained_loss", "Untrained model loss", "{:.4f}"),
    ("masked_tokens", "Masked tokens evaluated", "{:,}"),
    ("split", "Evaluation split", "{}"),
]


def section(heading: str, lines: Iterable[str]) -> list[str]:
    """The heading, its lines and a blank line."""
    return [heading, *lines, ""]


def format_metric(fmt: str, value) -> str:
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def metrics_table(metrics: Mapping[str, Any] | None) -> list[str]:
    if not metrics:
        return ["_No evaluation metrics were recorded for this run (evaluate did not run or failed)._"]
    lines = ["| metric | value |", "|---|---|"]
    for key, label, fmt in METRIC_ROWS:
        if metrics.get(key) is not None:
            if key == "baseline_accuracy" and metrics.get("baseline_token"):
                label = f"{label[:-1]}, `{metrics['baseline_token']}`)"
            lines.append(f"| {label} | {format_metric(fmt, metrics[key])} |")
    return lines


def downstream_table(downstream: Mapping[str, Any] | None) -> list[str]:
    """Per task its metric's mean ± spread over the seeds, from the trained encoder and from random weights."""
    tasks = (downstream or {}).get("tasks")
    skipped = [f"- {s['name']}: skipped ({s['reason']})" for s in (downstream or {}).get("skipped", [])]
    if not tasks:
        return [
            "_No downstream evaluation was recorded for this run (downstream.tasks is empty, or the "
            "downstream step did not run)._",
            *skipped,
        ]
    lines = [
        "| task | metric | this model (mean ± std) | 95% interval | seeds | random init, same budget | gain "
        "| examples |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in tasks:
        ours, base = t["pretrained"], t.get("random_init")
        baseline = f"{base['mean']:.4f} ± {base['std']:.4f}{_interval(base)}" if base else "not run"
        gain = f"{ours['mean'] - base['mean']:+.4f}" if base else "—"
        examples = f"{t['examples']['train']:,} train, {t['examples']['validation']:,} scored"
        bounds = _interval(ours).strip() or "—"
        lines.append(
            f"| {t['name']} | {t['metric']} | {ours['mean']:.4f} ± {ours['std']:.4f} | {bounds} "
            f"| {len(t['seeds'])} | {baseline} | {gain} | {examples} |"
        )
    b = tasks[0]["budget"]
    lines += [
        "",
        f"Each seed fine-tunes for {b['steps']} steps of {b['batch_size']} examples (learning rate "
        f"{b['learning_rate']:g}, {b['max_length']} tokens); ± is the standard deviation over the seeds, the "
        "interval a bootstrap over the seeds and the scored examples.",
    ]
    warnings = [w for t in tasks for w in t.get("warnings", [])]
    lines += ["", *[f"- **Warning:** {w}" for w in warnings]] if warnings else []
    return lines + (["", *skipped] if skipped else [])


def _interval(runs: Mapping[str, Any]) -> str:
    bounds = runs.get("interval")
    return f" [{bounds[0]:.4f}, {bounds[1]:.4f}]" if bounds else ""


def fill_mask_lines(predictions: list | None, limit: int = 3) -> list[str]:
    if not predictions:
        return ["_No fill-mask predictions were recorded for this run (the smoke test did not run)._"]
    lines = []
    for probe in predictions:
        top = ", ".join(
            f"`{p.get('token_str', '').strip()}` ({p.get('score', 0):.3f})"
            for p in (probe.get("predictions") or [])[:limit]
        )
        lines.append(f"- `{probe.get('probe', '')}` → {top or '_no predictions_'}")
    return lines
