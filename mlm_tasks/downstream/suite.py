"""Score a model folder on every task of `downstream.tasks`: seeds train.seed, train.seed + 1, ... from its
weights and, with `downstream.random_init`, as many from random weights under the same budget.

    result = score_model(cfg, model_dir, model_uri)       # DownstreamResult: tasks, skipped, settings
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import DownstreamConfig, DownstreamTask, PipelineConfig
from mlm_tasks.downstream.examples import TaskData
from mlm_tasks.downstream.held_out import ARTICLE_SOURCES, HELD_OUT_SOURCES
from mlm_tasks.downstream.scores import budget_of, flags, task_scores
from mlm_tasks.downstream.tasks import load_task
from mlm_tasks.downstream.uncertainty import half_width_for
from mlm_tasks.paths import join
from mlm_tasks.results import DownstreamResult, DownstreamTaskScores

log = logging.getLogger(__name__)


def scored_settings(cfg: DownstreamConfig) -> dict[str, Any]:
    """downstream.* less the gate's thresholds: changing one of those does not fine-tune again."""
    gate_only = {"min_scores": True, "max_regression": True, "max_half_width": True, "check_contamination": True}
    return cfg.model_dump(mode="json", exclude={**gate_only, "tasks": {"__all__": {"min_score"}}})


def reflag(done: DownstreamResult, cfg: DownstreamConfig) -> DownstreamResult:
    """A reused result's warnings under today's thresholds (max_half_width, check_contamination)."""
    for entry in done["tasks"]:
        found = (entry.get("contamination") or {}).get("warning") if cfg.check_contamination else None
        entry["warnings"] = flags(entry, cfg.max_half_width) + ([found] if found else [])
    return done


def score_model(cfg: PipelineConfig, model_dir: str, model_uri: str) -> DownstreamResult:
    """Fine-tune and score the model in the local folder `model_dir` (`model_uri`: where it lives, recorded)."""
    from mlm_tasks.data.tokenizer import load_tokenizer

    started = time.perf_counter()
    result: DownstreamResult = {
        "tasks": [],
        "skipped": [],
        "model": model_uri,
        "settings": scored_settings(cfg.downstream),
        "elapsed_s": 0.0,
    }
    seeds = [cfg.train.seed + i for i in range(cfg.downstream.seeds)]
    loaded: dict[str, tuple[list[str], list[str] | None]] = {}  # the scored texts, for the contamination check
    tokenizer = load_tokenizer(model_dir)
    positions = storage.read_json(join(model_dir, "config.json"))["max_position_embeddings"]
    budget = budget_of(cfg.downstream, min(cfg.downstream.max_length, positions - 2))  # RoBERTa: pad + 1 first
    for task_cfg in cfg.downstream.tasks:
        if task_cfg.source in HELD_OUT_SOURCES and cfg.corpus.source not in ARTICLE_SOURCES:
            reason = f"{task_cfg.source} needs a corpus of articles, and corpus.source is {cfg.corpus.source}"
            log.warning("Task %s skipped: %s", task_cfg.name, reason)
            result["skipped"].append({"name": task_cfg.name, "reason": reason})
            continue
        task = load_task(task_cfg, cfg.corpus)
        if task_cfg.source not in HELD_OUT_SOURCES:  # held_out.py already keeps the corpus's rows out
            loaded[task.name] = (task.validation.texts, task.validation.pairs)
        result["tasks"].append(_score_task(cfg.downstream, task_cfg, task, model_dir, tokenizer, budget, seeds))
    if cfg.downstream.check_contamination and loaded:
        from mlm_tasks.downstream.contamination import mark_contamination

        mark_contamination(cfg.corpus, result["tasks"], loaded)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def _score_task(
    cfg: DownstreamConfig,
    task_cfg: DownstreamTask,
    task: TaskData,
    model_dir: str,
    tokenizer: Any,
    budget: dict[str, Any],
    seeds: list[int],
) -> DownstreamTaskScores:
    from mlm_tasks.downstream.finetune import encode, finetune

    n = len(task.validation)
    log.info(
        "Task %s: %d training and %d validation examples, %d classes%s; %d steps of %d, lr %g, seeds %s",
        *(task.name, len(task.train), n, task.num_labels, " (pairs)" if task.is_pair else ""),
        *(budget["steps"], budget["batch_size"], budget["learning_rate"], seeds),
    )
    if half_width_for(n) > cfg.max_half_width:
        log.warning(
            "Task %s: %d scored examples give an accuracy a 95%% interval of up to ±%.3f, wider than "
            "downstream.max_half_width ±%g: its score will be flagged as too uncertain to compare models",
            *(task.name, n, half_width_for(n), cfg.max_half_width),
        )
    train, validation = (encode(tokenizer, split, budget["max_length"]) for split in (task.train, task.validation))
    runs = {
        pretrained: [finetune(model_dir, train, validation, task.num_labels, cfg, seed, pretrained) for seed in seeds]
        for pretrained in ((True, False) if cfg.random_init else (True,))
    }
    entry = task_scores(task_cfg, task, budget, cfg, runs[True], runs.get(False, []))
    base, ours = entry["random_init"], entry["pretrained"]
    log.info(
        "Task %s: %s %.4f ± %.4f over %d seeds, 95%% interval [%.4f, %.4f] over seeds and %d examples%s",
        *(task.name, entry["metric"], ours["mean"], ours["std"], len(seeds), *ours["interval"], n),
        f" (random init: {base['mean']:.4f} ± {base['std']:.4f}, [{base['interval'][0]:.4f}, "
        f"{base['interval'][1]:.4f}])"
        if base
        else "",
    )
    for warning in entry["warnings"]:
        log.warning("%s", warning)
    return entry
