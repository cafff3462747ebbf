"""The seeds' scores as the table shows them (mean, spread, 95% interval), and the part the next run's gate
compares (`published_scores`). No TensorFlow here.

    entry = task_scores(task_cfg, task, budget, cfg.downstream, pretrained_runs, random_runs)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mlm_tasks.config import DownstreamConfig, DownstreamTask
from mlm_tasks.downstream.examples import TaskData
from mlm_tasks.downstream.uncertainty import examples_fingerprint, interval
from mlm_tasks.results import DownstreamRuns, DownstreamTaskScores


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one seed)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarize(runs: list[dict[str, Any]], metric: str, labels: list[Any], num_labels: int) -> DownstreamRuns:
    """Mean and spread over the seeds, and the 95% interval of the mean over seeds and examples (uncertainty.py)."""
    values = [r[metric] for r in runs]
    mean, std = spread(values)
    lo, hi = interval(metric, [r["predictions"] for r in runs], labels, num_labels)
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "interval": [lo, hi], "runs": runs}


def flags(entry: DownstreamTaskScores, max_half_width: float) -> list[str]:
    """What makes a task's score weak evidence, in words the report and the approval page show."""
    lo, hi = entry["pretrained"]["interval"]
    if (hi - lo) / 2 > max_half_width:
        n = entry["examples"]["validation"]
        return [
            f"{entry['name']}: the 95% interval of {entry['metric']} is ±{(hi - lo) / 2:.3f} over {n} scored examples, "
            f"wider than downstream.max_half_width ±{max_half_width:g}: too few examples to tell models apart "
            f"(an accuracy needs about {needed_examples(max_half_width):,} for ±{max_half_width:g})."
        ]
    return []


def needed_examples(half_width: float) -> int:
    """Examples an accuracy near 0.5 needs for a 95% half-interval of `half_width` (one seed)."""
    return math.ceil((1.96 * 0.5 / half_width) ** 2)


def budget_of(cfg: DownstreamConfig, max_length: int) -> dict[str, Any]:
    """What a score depends on besides the model and the task: two scores compare only under the same budget."""
    return {
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "learning_rate": cfg.learning_rate,
        "max_length": max_length,
        "seeds": cfg.seeds,
    }


def task_scores(
    task_cfg: DownstreamTask,
    task: TaskData,
    budget: dict[str, Any],
    cfg: DownstreamConfig,
    pretrained: list[dict[str, Any]],
    random_init: list[dict[str, Any]],
) -> DownstreamTaskScores:
    labels, metric = task.validation.labels, task_cfg.metric
    entry: DownstreamTaskScores = {
        "name": task.name,
        "source": task_cfg.source,
        "metric": metric,
        "labels": task.label_names,
        "pair": task.is_pair,
        "regression": task.regression,
        "examples": {"train": len(task.train), "validation": len(task.validation)},
        "validation_fingerprint": examples_fingerprint(task.validation.texts, task.validation.pairs, labels),
        "validation_labels": labels,
        "seeds": [r["seed"] for r in pretrained],
        "budget": budget,
        "min_score": cfg.min_score(task_cfg),
        "pretrained": summarize(pretrained, metric, labels, task.num_labels),
        "random_init": summarize(random_init, metric, labels, task.num_labels) if random_init else None,
        "warnings": [],
        "contamination": None,  # contamination.py checks tasks from files and `datasets`
    }
    entry["warnings"] = flags(entry, cfg.max_half_width)
    return entry


def published_scores(downstream: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per task what published/<repo>/metrics.json keeps for the next run's gate (pairwise: each seed's predictions)."""
    return {
        t["name"]: {
            "metric": t["metric"],
            "mean": t["pretrained"]["mean"],
            "std": t["pretrained"]["std"],
            "interval": t["pretrained"].get("interval"),
            "budget": t["budget"],
            "validation_fingerprint": t.get("validation_fingerprint"),
            "validation_labels": t.get("validation_labels"),
            "predictions": [r["predictions"] for r in t["pretrained"]["runs"] if "predictions" in r] or None,
        }
        for t in (downstream or {}).get("tasks", [])
    }
