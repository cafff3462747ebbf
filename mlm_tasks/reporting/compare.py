"""Every run under an output_root in one table, and their validation losses against tokens seen (step ×
global batch × sequence length), from each run's own artifacts only.

    rows = compare_runs("out")                        # or compare_runs("gs://b/mlm", ["run-a", "run-b"])
    write_comparison("out", rows)                     # out/compare/compare.md (+ val_loss.png): the `compare` verb
"""

from __future__ import annotations

import logging
from typing import Any

from mlm_tasks import storage
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import DataPaths, RunFolder, join
from mlm_tasks.reporting.card import read_run_artifacts
from mlm_tasks.reporting.plots import line_plot
from mlm_tasks.results import RunRow
from mlm_tasks.training.progress import read_history

log = logging.getLogger(__name__)
MAX_PLOTTED = 8  # lines past this are unreadable: the plot keeps the chosen runs' first eight


def run_names(output_root: str) -> list[str]:
    """The run folders under output_root/runs that finished training, sorted by name."""
    root = join(output_root, "runs")
    if not storage.exists(root):
        return []
    names = sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in storage.listdir(root))
    return [name for name in names if storage.exists(RunFolder(output_root, name).train_summary)]


def _tokens_per_step(output_root: str, summary: dict[str, Any], data_info: dict[str, Any] | None) -> int | None:
    """Global batch × sequence length (from the run's data.json, else its shard set's manifest)."""
    length = (data_info or {}).get("max_length")
    if not length and summary.get("data_fingerprint"):
        manifest = storage.read_json_if_exists(DataPaths(output_root, summary["data_fingerprint"]).manifest)
        length = (manifest or {}).get("max_length")
    if length and summary.get("global_batch"):
        return int(summary["global_batch"]) * int(length)
    return None


def run_row(output_root: str, name: str) -> RunRow:
    run = RunFolder(output_root, name)
    art = read_run_artifacts(run)
    summary, metrics, data_info = art["summary"] or {}, art["metrics"] or {}, art["data_info"]
    history = read_history(run)
    per_step = _tokens_per_step(output_root, summary, data_info)
    base = (data_info or {}).get("base_model") or {}
    tasks = [(t["name"], t["pretrained"]) for t in (art["downstream"] or {}).get("tasks", []) if "pretrained" in t]
    return RunRow(
        run=name,
        data_fingerprint=summary.get("data_fingerprint"),
        base_model=base.get("init_from"),
        steps=summary.get("steps"),
        tokens=per_step * summary["steps"] if per_step and summary.get("steps") else None,
        val_loss=summary.get("val_loss"),
        best_val_loss=summary.get("best_val_loss"),
        best_step=summary.get("best_step"),
        eval_loss=metrics.get("loss"),
        downstream={task: scores["mean"] for task, scores in tasks},
        downstream_interval={task: scores["interval"] for task, scores in tasks if scores.get("interval")},
        wall_time_s=summary.get("elapsed_s"),
        cost_usd=summary.get("cost_usd"),  # the training's hours at the run's price
        val_curve=[[h["step"] * per_step, h["val_loss"]] for h in history if "val_loss" in h] if per_step else [],
    )


def compare_runs(output_root: str, names: list[str] | None = None) -> list[RunRow]:
    """The rows of the run folders `names`, or of every finished run under output_root."""
    names = run_names(output_root) if names is None else names
    missing = [n for n in names if not storage.exists(RunFolder(output_root, n).train_summary)]
    if missing:
        raise MissingArtifactError(
            f"No finished training for run(s) {', '.join(missing)} under {output_root}: "
            f"the runs there are {', '.join(run_names(output_root)) or 'none'}."
        )
    return [run_row(output_root, name) for name in names]


def _num(value: Any, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "—"


def _score(row: RunRow, task: str) -> str:
    """The mean and, where recorded, its 95% interval: two runs differ only where their intervals say so."""
    bounds = row.get("downstream_interval", {}).get(task)
    shown = _num(row["downstream"].get(task), "{:.3f}")
    return f"{shown} [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else shown


def table_lines(rows: list[RunRow], current: str | None = None) -> list[str]:
    """The Markdown table (`current`, the run a report is about, in bold)."""
    tasks = sorted({task for row in rows for task in row["downstream"]})
    head = ["run", "data", "base model", "steps", "tokens", "val loss (last)", "val loss (best @ step)", "eval loss"]
    head += [*tasks, "wall time", "cost"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        best = f"{row['best_val_loss']:.4f} @ {row['best_step']}" if row["best_val_loss"] is not None else "—"
        cells = [
            f"**{row['run']}**" if row["run"] == current else row["run"],
            f"`{row['data_fingerprint']}`" if row["data_fingerprint"] else "—",
            f"`{row['base_model']}`" if row["base_model"] else "random init",
            _num(row["steps"], "{:,}"),
            _num(row["tokens"], "{:,}"),
            _num(row["val_loss"], "{:.4f}"),
            best,
            _num(row["eval_loss"], "{:.4f}"),
            *[_score(row, t) for t in tasks],
            _num((row["wall_time_s"] or 0) / 60 if row["wall_time_s"] is not None else None, "{:.1f} min"),
            _num(row["cost_usd"], "${:,.2f}"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def val_loss_plot(rows: list[RunRow]) -> bytes | None:
    """Validation loss against tokens seen, one line per run that validated during training."""
    series = {
        row["run"]: ([p[0] for p in row["val_curve"]], [p[1] for p in row["val_curve"]])
        for row in rows
        if row["val_curve"]
    }
    if not series:
        return None
    if len(series) > MAX_PLOTTED:
        log.info("Plotting the first %d of %d runs with validation losses.", MAX_PLOTTED, len(series))
        series = dict(list(series.items())[:MAX_PLOTTED])
    return line_plot(series, "Validation loss (fixed 15% masks)", "tokens seen", "validation loss")


def write_comparison(output_root: str, rows: list[RunRow]) -> dict[str, Any]:
    """output_root/compare/compare.md (the table) and val_loss.png (the plot, when any run validated);
    what the `compare` verb prints."""
    folder = join(output_root, "compare")
    page = ["# Runs under `" + output_root + "`", "", *table_lines(rows)]
    png = val_loss_plot(rows)
    if png is not None:
        storage.write_bytes(join(folder, "val_loss.png"), png)
        page += ["", "![Validation loss against tokens seen](val_loss.png)"]
    storage.write_text(join(folder, "compare.md"), "\n".join(page) + "\n")
    log.info("Compared %d run(s): %s", len(rows), join(folder, "compare.md"))
    return {
        "table": join(folder, "compare.md"),
        "plot": join(folder, "val_loss.png") if png else None,
        "rows": [{k: v for k, v in row.items() if k != "val_curve"} for row in rows],
    }
