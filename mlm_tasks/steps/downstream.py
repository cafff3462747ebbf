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
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import DownstreamTask, PipelineConfig
from mlm_tasks.downstream.examples import TaskData
from mlm_tasks.downstream.held_out import ARTICLE_SOURCES
from mlm_tasks.downstream.scores import budget_of, flags, task_scores
from mlm_tasks.downstream.tasks import load_task
from mlm_tasks.downstream.uncertainty import half_width_for
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import DownstreamResult, DownstreamTaskScores

log = logging.getLogger(__name__)


def downstream(cfg: PipelineConfig, ctx: RunContext) -> DownstreamResult:
    """Fine-tune and score run `ctx.run_id`'s model on every configured task; the table's rows."""
    from mlm_tasks.data.tokenizer import load_tokenizer

    # What the scores depend on: the gate's thresholds are left out, so changing one does not fine-tune again.
    settings = cfg.downstream.model_dump(
        mode="json",
        exclude={
            "min_scores": True,
            "max_regression": True,
            "max_half_width": True,
            "check_contamination": True,
            "tasks": {"__all__": {"min_score"}},
        },
    )
    run = ctx.run
    result: DownstreamResult = {"tasks": [], "skipped": [], "model": run.model, "settings": settings, "elapsed_s": 0.0}
    if not cfg.downstream.tasks:
        log.info("downstream.tasks is empty: no downstream evaluation for run %s", run.run_id)
        return result
    done = storage.read_json_if_exists(run.downstream)
    if done and done.get("settings") == settings and all("interval" in t["pretrained"] for t in done["tasks"]):
        log.info("Downstream scores already at %s for these settings: nothing to do", run.downstream)
        for entry in done["tasks"]:  # the flag's threshold may have changed since
            found = (entry.get("contamination") or {}).get("warning") if cfg.downstream.check_contamination else None
            entry["warnings"] = flags(entry, cfg.downstream.max_half_width) + ([found] if found else [])
        return done
    if not storage.exists(join(run.model, "config.json")):
        raise MissingArtifactError(f"No trained model at {run.model}: run the train step for run {run.run_id} first.")
    started = time.perf_counter()
    seeds = [cfg.train.seed + i for i in range(cfg.downstream.seeds)]
    loaded: dict[str, tuple[list[str], list[str] | None]] = {}  # the scored texts, for the contamination check
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
            if task_cfg.source != "held_out_article":  # held_out.py already keeps the corpus's rows out
                loaded[task.name] = (task.validation.texts, task.validation.pairs)
            result["tasks"].append(_score_task(cfg, task_cfg, task, model_dir, tokenizer, budget, seeds))
    if cfg.downstream.check_contamination:
        _mark_contamination(cfg, result, loaded)
    result["elapsed_s"] = time.perf_counter() - started
    storage.write_json(run.downstream, result)
    log.info("Downstream scores of %d task(s) in %.0fs: %s", len(result["tasks"]), result["elapsed_s"], run.downstream)
    return result


def _mark_contamination(
    cfg: PipelineConfig, result: DownstreamResult, tasks: dict[str, tuple[list[str], list[str] | None]]
) -> None:
    """Adds, per task from files or `datasets`, the scored examples found in the pretraining train split
    (contamination.py) to the entry, and a warning when there are any."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.downstream.contamination import NGRAM, contaminated

    if not tasks:
        return
    began = time.perf_counter()
    found = contaminated(tasks, open_corpus(cfg.corpus).rows("train"))
    log.info(
        "Contamination check (%d-grams) of %d task(s) against the train split: %.0fs",
        NGRAM,
        len(tasks),
        time.perf_counter() - began,
    )
    for entry in result["tasks"]:
        if entry["name"] not in found:
            continue
        hits, texts = found[entry["name"]], tasks[entry["name"]][0]
        examples = [texts[i][:200] for i in hits[:3]]
        record: dict[str, Any] = {"ngram": NGRAM, "checked": len(texts), "found": len(hits), "examples": examples}
        entry["contamination"] = record
        if hits:
            warning = (
                f"{entry['name']}: {len(hits)} of {len(texts)} scored examples share a {NGRAM}-word sequence with the "
                f"pretraining train split (e.g. {texts[hits[0]][:120]!r}): the model may have read them, and its "
                "score may be inflated; remove them from the task or the corpus."
            )
            record["warning"] = warning
            entry["warnings"].append(warning)
            log.warning("%s", warning)


def _score_task(
    cfg: PipelineConfig,
    task_cfg: DownstreamTask,
    task: TaskData,
    model_dir: str,
    tokenizer: Any,
    budget: dict[str, Any],
    seeds: list[int],
) -> DownstreamTaskScores:
    """One task's row: `seeds` fine-tuning runs from the trained encoder and, with downstream.random_init, as
    many from random weights, scored with their spread and interval."""
    from mlm_tasks.downstream.finetune import encode, finetune

    max_length = budget["max_length"]
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
    best = half_width_for(len(task.validation))
    if best > cfg.downstream.max_half_width:
        log.warning(
            "Task %s: %d scored examples give an accuracy a 95%% interval of up to ±%.3f, wider than "
            "downstream.max_half_width ±%g: its score will be flagged as too uncertain to compare models",
            task.name,
            len(task.validation),
            best,
            cfg.downstream.max_half_width,
        )
    train, validation = (
        encode(tokenizer, task.train, max_length),
        encode(tokenizer, task.validation, max_length),
    )
    pretrained = [finetune(model_dir, train, validation, task.num_labels, cfg.downstream, seed, True) for seed in seeds]
    random_init = (
        [finetune(model_dir, train, validation, task.num_labels, cfg.downstream, seed, False) for seed in seeds]
        if cfg.downstream.random_init
        else []
    )
    entry = task_scores(
        task_cfg,
        task,
        budget,
        cfg.downstream.min_score(task_cfg),
        pretrained,
        random_init,
        cfg.downstream.max_half_width,
    )
    base, ours = entry["random_init"], entry["pretrained"]
    log.info(
        "Task %s: %s %.4f ± %.4f over %d seeds, 95%% interval [%.4f, %.4f] over seeds and %d examples%s",
        task.name,
        entry["metric"],
        ours["mean"],
        ours["std"],
        len(seeds),
        *ours["interval"],
        len(task.validation),
        f" (random init: {base['mean']:.4f} ± {base['std']:.4f}, [{base['interval'][0]:.4f}, "
        f"{base['interval'][1]:.4f}])"
        if base
        else "",
    )
    for warning in entry["warnings"]:
        log.warning("%s", warning)
    return entry
