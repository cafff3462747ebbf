"""Step downstream: fine-tune the trained encoder on each task of `downstream.tasks`, N seeds each, beside
the same budget from random weights, and record the scores' mean and spread.

    python -m mlm_tasks downstream --config configs/default.yaml --run-id my-run

Reads runs/<run>/model (TensorFlow weights and tokenizer); writes runs/<run>/eval/downstream.json, which
the gate (downstream.min_scores, no regression against the last published model), the report and the
model card read. Seeds are train.seed, train.seed + 1, ...; each run is deterministic per seed. With the
same downstream settings a rerun (a retry, a cleared task) reuses the file; no tasks: nothing to do.
The default's held_out_article task is skipped, with the reason in the log and the file, on a corpus
without articles (a run that switched corpus.source on the form).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.downstream.held_out import ARTICLE_SOURCES
from mlm_tasks.downstream.scores import budget_of, task_scores
from mlm_tasks.downstream.tasks import load_task
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import DownstreamResult

log = logging.getLogger(__name__)


def downstream(cfg: PipelineConfig, ctx: RunContext) -> DownstreamResult:
    """Fine-tune and score run `ctx.run_id`'s model on every configured task; the table's rows."""
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.downstream.finetune import encode, finetune

    # What the scores depend on: the gate's thresholds are left out, so changing one does not fine-tune again.
    settings = cfg.downstream.model_dump(
        mode="json", exclude={"min_scores": True, "max_regression": True, "tasks": {"__all__": {"min_score"}}}
    )
    run = ctx.run
    result: DownstreamResult = {"tasks": [], "skipped": [], "model": run.model, "settings": settings, "elapsed_s": 0.0}
    if not cfg.downstream.tasks:
        log.info("downstream.tasks is empty: no downstream evaluation for run %s", run.run_id)
        return result
    done = storage.read_json_if_exists(run.downstream)
    if done and done.get("settings") == settings:
        log.info("Downstream scores already at %s for these settings: nothing to do", run.downstream)
        return done
    if not storage.exists(join(run.model, "config.json")):
        raise MissingArtifactError(f"No trained model at {run.model}: run the train step for run {run.run_id} first.")
    started = time.perf_counter()
    seeds = [cfg.train.seed + i for i in range(cfg.downstream.seeds)]
    with tempfile.TemporaryDirectory(prefix="mlm-downstream-") as tmp:
        model_dir = storage.download_dir(run.model, tmp)
        tokenizer = load_tokenizer(model_dir)
        with open(join(model_dir, "config.json")) as f:
            positions = json.load(f)["max_position_embeddings"]
        max_length = min(cfg.downstream.max_length, positions - 2)  # RoBERTa's positions start at pad + 1
        budget = budget_of(cfg.downstream, max_length)
        for task_cfg in cfg.downstream.tasks:
            if task_cfg.source == "held_out_article" and cfg.corpus.source not in ARTICLE_SOURCES:
                # The default's own task, on a corpus it does not fit (a form that switched the corpus source).
                reason = f"held_out_article needs a corpus of articles, and corpus.source is {cfg.corpus.source}"
                log.warning("Task %s skipped: %s", task_cfg.name, reason)
                result["skipped"].append({"name": task_cfg.name, "reason": reason})
                continue
            task = load_task(task_cfg, cfg.corpus)
            log.info(
                "Task %s: %d training and %d validation examples, %d classes%s; %d steps of %d, lr %g, seeds %s",
                task.name,
                len(task.train),
                len(task.validation),
                task.num_labels,
                " (pairs)" if task.is_pair else "",
                budget["steps"],
                budget["batch_size"],
                budget["learning_rate"],
                seeds,
            )
            train, validation = (
                encode(tokenizer, task.train, max_length),
                encode(tokenizer, task.validation, max_length),
            )
            pretrained = [
                finetune(model_dir, train, validation, task.num_labels, cfg.downstream, seed, True) for seed in seeds
            ]
            random_init = (
                [finetune(model_dir, train, validation, task.num_labels, cfg.downstream, seed, False) for seed in seeds]
                if cfg.downstream.random_init
                else []
            )
            entry = task_scores(task_cfg, task, budget, cfg.downstream.min_score(task_cfg), pretrained, random_init)
            result["tasks"].append(entry)
            base = entry["random_init"]
            log.info(
                "Task %s: %s %.4f ± %.4f over %d seeds%s",
                task.name,
                entry["metric"],
                entry["pretrained"]["mean"],
                entry["pretrained"]["std"],
                len(seeds),
                f" (random init: {base['mean']:.4f} ± {base['std']:.4f})" if base else "",
            )
    result["elapsed_s"] = time.perf_counter() - started
    storage.write_json(run.downstream, result)
    log.info("Downstream scores of %d task(s) in %.0fs: %s", len(result["tasks"]), result["elapsed_s"], run.downstream)
    return result
