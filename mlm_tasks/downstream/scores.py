"""The seeds' scores as the table shows them (mean and spread), and the part the next run's gate compares.

    entry = task_scores(task_cfg, task, budget, pretrained_runs, random_runs)   # one row of downstream.json
    published = published_scores(downstream_json)   # what publish keeps beside the eval metrics

No TensorFlow here: the gate, the report and the card read these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mlm_tasks.config import DownstreamConfig, DownstreamTask
from mlm_tasks.downstream.examples import TaskData
from mlm_tasks.results import DownstreamRuns, DownstreamTaskScores


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one seed)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarize(runs: list[dict[str, Any]], metric: str) -> DownstreamRuns:
    mean, std = spread([r[metric] for r in runs])
    return {
        "mean": mean,
        "std": std,
        "min": min(r[metric] for r in runs),
        "max": max(r[metric] for r in runs),
        "runs": runs,
    }


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
    min_score: float | None,
    pretrained: list[dict[str, Any]],
    random_init: list[dict[str, Any]],
) -> DownstreamTaskScores:
    return {
        "name": task.name,
        "source": task_cfg.source,
        "metric": task_cfg.metric,
        "labels": task.label_names,
        "pair": task.is_pair,
        "examples": {"train": len(task.train), "validation": len(task.validation)},
        "seeds": [r["seed"] for r in pretrained],
        "budget": budget,
        "min_score": min_score,
        "pretrained": summarize(pretrained, task_cfg.metric),
        "random_init": summarize(random_init, task_cfg.metric) if random_init else None,
    }


def published_scores(downstream: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per task: metric, mean, spread and budget (published/<repo>/metrics.json, for the next run's gate)."""
    return {
        t["name"]: {
            "metric": t["metric"],
            "mean": t["pretrained"]["mean"],
            "std": t["pretrained"]["std"],
            "budget": t["budget"],
        }
        for t in (downstream or {}).get("tasks", [])
    }
