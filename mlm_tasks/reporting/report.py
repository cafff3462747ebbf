"""The run report: loss and learning-rate curves and a one-page Markdown summary under runs/<run>/report/;
a piece not produced yet is named on the page instead of failing.

    key_metrics = write_report(cfg, run, data_info)    # loss.png, learning_rate.png, report.md; KeyMetrics
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths, join, safe_run_id
from mlm_tasks.reporting.card import (
    base_model_line,
    config_lines,
    corpus_credit,
    data_card_lines,
    read_run_artifacts,
    training_lines,
)
from mlm_tasks.reporting.compare import compare_runs, run_names, table_lines, val_loss_plot
from mlm_tasks.reporting.plots import line_plot, schedule_phases
from mlm_tasks.reporting.tables import downstream_table, fill_mask_lines, metrics_table, section
from mlm_tasks.results import KeyMetrics
from mlm_tasks.training.progress import read_history

log = logging.getLogger(__name__)
LOSS_PNG, LR_PNG, REPORT_MD, RUNS_PNG = "loss.png", "learning_rate.png", "report.md", "runs_val_loss.png"
COMPARED_RUNS = 20  # the report's table of runs: this one and the latest others (`compare` shows them all)


def write_report(cfg: PipelineConfig, run: RunPaths, data_info: Mapping[str, Any] | None = None) -> KeyMetrics:
    """Write the plots and report.md of `run`; the key metrics for XCom. `data_info`: the shard set's summary
    (else the run's data.json, else the metrics' fingerprint)."""
    art = read_run_artifacts(run, data_info)
    metrics, summary, predictions, data_info = art["metrics"], art["summary"], art["predictions"], art["data_info"]
    if not data_info and metrics and metrics.get("data_fingerprint"):
        data_info = {"fingerprint": metrics["data_fingerprint"]}
    history = read_history(run)
    plots, missing = _plots(run, history, metrics)
    for absent, what in (
        (summary, "training summary (train/summary.json)"),
        (metrics, "evaluation metrics (eval/metrics.json)"),
        (predictions, "fill-mask predictions (infer/predictions.json)"),
    ):
        if not absent:
            missing.append(what)
    report_uri = join(run.report, REPORT_MD)
    storage.write_text(report_uri, "\n".join(_page(cfg, run, art, data_info, plots, missing)) + "\n")
    log.info(
        "Wrote the run report to %s (%d history points; missing: %s)",
        *(report_uri, len(history), ", ".join(missing) or "nothing"),
    )
    metrics, summary, downstream = metrics or {}, summary or {}, art["downstream"]
    return {
        "report_uri": report_uri,
        "plots": plots,
        "missing": missing,
        "history_points": len(history),
        "steps": summary.get("steps"),
        "first_loss": summary.get("first_loss"),
        "last_loss": summary.get("last_loss"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "data_fingerprint": (data_info or {}).get("fingerprint"),
        "eval_loss": metrics.get("loss"),
        "perplexity": metrics.get("perplexity"),
        "accuracy": metrics.get("accuracy"),
        "baseline_accuracy": metrics.get("baseline_accuracy"),
        "untrained_accuracy": metrics.get("untrained_accuracy"),
        "downstream": {t["name"]: t["pretrained"]["mean"] for t in downstream["tasks"]} if downstream else None,
    }


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [
        (r["step"], r[key])
        for r in history
        if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float)) and math.isfinite(r[key])
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _plots(run: RunPaths, history: list[dict], metrics: Mapping[str, Any] | None) -> tuple[dict[str, str], list[str]]:
    """The loss and learning-rate plots under report/ ({name: uri}), and what was missing to draw them."""
    plots: dict[str, str] = {}
    missing: list[str] = []
    steps, losses = _series(history, "loss")
    if steps:
        names = {"loss": "eval loss", "untrained_loss": "untrained eval loss"}
        refs = {name: metrics[k] for k, name in names.items() if metrics and metrics.get(k) is not None}
        series = {"loss": (steps, losses)}
        val = _series(history, "val_loss")  # train.eval_every
        if val[0]:
            series["validation loss (fixed 15% masks)"] = val
        storage.write_bytes(join(run.report, LOSS_PNG), line_plot(series, "Training loss", "step", "loss", refs))
        plots["loss"] = join(run.report, LOSS_PNG)
    else:
        missing.append("training history (train/history.jsonl): no loss curve")
    lr_steps, lrs = _series(history, "learning_rate")
    norms = _series(history, "grad_norm")  # before clipping (train.clip_norm)
    if lr_steps:
        right = ("gradient norm", {"gradient norm": norms}) if norms[0] else None
        spans = schedule_phases(lr_steps, lrs)  # warmup, stable (wsd), decay
        rates = {"learning rate": (lr_steps, lrs)}
        png = line_plot(rates, "Learning rate schedule", "step", "learning rate", right=right, spans=spans)
        storage.write_bytes(join(run.report, LR_PNG), png)
        plots["learning_rate"] = join(run.report, LR_PNG)
    elif steps:
        missing.append("learning rate in the training history: no schedule plot")
    return plots, missing


def _page(
    cfg: PipelineConfig,
    run: RunPaths,
    art: Mapping[str, Any],
    data_info: Mapping[str, Any] | None,
    plots: dict[str, str],
    missing: list[str],
) -> list[str]:
    metrics = art["metrics"]
    page = [
        f"# Run report: `{run.run_id}`",
        "",
        f"Artifacts: `{run.root}`",
        "",
        *section("## Data", data_lines(cfg, data_info)),
        *section("## Configuration", config_lines(cfg, data_info)),
        *section("## Training", training_lines(art["summary"], art["restarts"])),
        f"![Training loss]({LOSS_PNG})" if "loss" in plots else "_No loss curve: no training history yet._",
        "",
        f"![Learning rate]({LR_PNG})" if "learning_rate" in plots else "_No learning-rate plot._",
        "",
        *section("## Evaluation", metrics_table(metrics)),
        *_vs_baseline(metrics),
        "",
        *section("## Downstream tasks", downstream_table(art["downstream"])),
        *section("## Fill-mask examples", fill_mask_lines(art["predictions"])),
        *_runs_section(cfg.output_root, run, plots),
        "",
        "## Logs",
        f"- TensorBoard: [../tensorboard/](../tensorboard/) — `tensorboard --logdir {run.tensorboard}`",
    ]
    published = storage.read_json_if_exists(run.published)
    if published:
        page.append(f"- Published to the Hub: [{published.get('repo_id')}]({published.get('commit_url')})")
    if missing:
        page += ["", "## Not available", *[f"- {m}" for m in missing]]
    return page


def data_lines(cfg: PipelineConfig, data_info: Mapping[str, Any] | None) -> list[str]:
    """The Data section: source, fingerprint, counts, the data card and the corpus credit."""
    credit, _ = corpus_credit(cfg, data_info)
    lines = [f"- Source: `{cfg.corpus.source}`"]
    if not data_info:
        return [
            *lines,
            f"- Credit: {credit}",
            "- _No data reference recorded for this run (fingerprint and counts unknown)._",
        ]
    lines.append(f"- Data fingerprint: `{data_info.get('fingerprint', '?')}`")
    if data_info.get("base_model"):
        lines.append(f"- Base model (its tokenizer encoded the shards): {base_model_line(data_info['base_model'])}")
    for key in ("records", "tokens", "shards"):
        if isinstance(data_info.get(key), dict):
            counts = ", ".join(f"{s} {n:,}" if isinstance(n, int) else f"{s} {n}" for s, n in data_info[key].items())
            lines.append(f"- {key.capitalize()}: {counts}")
    for key in ("vocab_size", "max_length", "cache_hit", "data_root"):
        if key in data_info:
            lines.append(f"- {key.replace('_', ' ').capitalize()}: `{data_info[key]}`")
    return [*lines, *data_card_lines(data_info), f"- Credit: {credit}"]


def _vs_baseline(metrics: Mapping[str, Any] | None) -> list[str]:
    if not metrics or metrics.get("accuracy") is None:
        return []
    return [
        f"- Accuracy vs {label}: {metrics['accuracy'] - metrics[key]:+.4f}"
        for key, label in (
            ("baseline_accuracy", "the most-frequent-token baseline"),
            ("untrained_accuracy", "the untrained model"),
        )
        if metrics.get(key) is not None
    ]


def _runs_section(output_root: str, run: RunPaths, plots: dict[str, str]) -> list[str]:
    """This run beside the latest others under output_root: the table and validation loss by tokens seen."""
    this = safe_run_id(run.run_id)
    others = [name for name in run_names(output_root) if name != this][-(COMPARED_RUNS - 1) :]
    rows = compare_runs(output_root, [*others, this] if storage.exists(run.train_summary) else others)
    if not rows:
        return ["## All runs under output_root", "_No run under this output_root has finished training._"]
    lines = [
        "## All runs under output_root",
        f"The latest {len(rows)} run(s) (`python -m mlm_tasks compare` lists them all):",
        "",
        *table_lines(rows, current=this),
    ]
    png = val_loss_plot(rows)
    if png is not None:
        storage.write_bytes(join(run.report, RUNS_PNG), png)
        plots["runs_val_loss"] = join(run.report, RUNS_PNG)
        lines += ["", f"![Validation loss against tokens seen]({RUNS_PNG})"]
    return lines
