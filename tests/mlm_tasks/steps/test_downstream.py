"""The downstream step end to end on a tiny encoder and tiny tasks (tens of examples, a few steps, 2 seeds):
the table's fields, the random-init baseline, determinism per seed, reuse on a rerun; the gate's minimum
scores and its comparison with the last published model; the table in the report and the model card."""

from __future__ import annotations

import copy
import csv
import json

import pytest

from mlm_tasks import paths, storage
from mlm_tasks.config import GateConfig, build_config
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.reporting.card import render_model_card
from mlm_tasks.steps.downstream import downstream
from mlm_tasks.steps.gate import evaluate_gate, gate
from mlm_tasks.steps.report import report
from peers.downstream_data import pair_rows, save_tiny_encoder, sentiment_rows
from peers.run_artifacts import METRICS, make_run

BUDGET = {"seeds": 2, "steps": 6, "batch_size": 8, "learning_rate": 0.001, "max_length": 32}


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks")
    with open(folder / "sst.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["sentence", "label"])
        writer.writeheader()
        writer.writerows(sentiment_rows(32, 1))
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_rows(24, 2)))
    return folder


def _cfg(root, task_files, **downstream):
    return build_config(
        {
            "output_root": str(root),
            "downstream": {
                **BUDGET,
                "tasks": [
                    {
                        "name": "sst",
                        "train_file": str(task_files / "sst.csv"),
                        "validation_file": str(task_files / "sst.csv"),
                        "max_eval_examples": 16,
                    },
                    {
                        "name": "pairs",
                        "train_file": str(task_files / "pairs.jsonl"),
                        "validation_file": str(task_files / "pairs.jsonl"),
                        "metric": "f1",
                    },
                ],
                **downstream,
            },
        }
    )


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_scores_per_task_with_the_random_init_baseline(tmp_path, task_files):
    from mlm_tasks.downstream.finetune import encode, finetune
    from mlm_tasks.downstream.tasks import load_task

    cfg = _cfg(tmp_path, task_files)
    ctx = RunContext.of(cfg, "r1")
    save_tiny_encoder(ctx.run.model)
    result = downstream(cfg, ctx)

    assert storage.read_json(ctx.run.downstream) == result
    sst, pairs = result["tasks"]
    assert (sst["name"], sst["metric"], sst["pair"], sst["examples"]) == (
        "sst",
        "accuracy",
        False,
        {"train": 32, "validation": 16},
    )
    assert (pairs["metric"], pairs["pair"], pairs["labels"]) == ("f1", True, ["0", "1"])
    assert sst["budget"] == {"steps": 6, "batch_size": 8, "learning_rate": 0.001, "max_length": 32, "seeds": 2}
    for entry in (sst, pairs):
        assert entry["seeds"] == [42, 43]  # train.seed, + 1
        for model in ("pretrained", "random_init"):
            runs = entry[model]["runs"]
            assert [r["seed"] for r in runs] == [42, 43]
            values = [r[entry["metric"]] for r in runs]
            assert entry[model]["mean"] == pytest.approx(sum(values) / 2)
            assert entry[model]["std"] == pytest.approx(abs(values[0] - values[1]) / 2**0.5)
            assert all(0 <= v <= 1 for v in values) and all("accuracy" in r and "f1" in r for r in runs)
    # The two models are different starting points: their first seeds do not train alike.
    assert sst["pretrained"]["runs"][0]["final_loss"] != sst["random_init"]["runs"][0]["final_loss"]

    # One seed, one result: the same run again gives the same loss and scores, bit for bit.
    task = load_task(cfg.downstream.tasks[0], cfg.corpus)
    tokenizer_dir = storage.local_path(ctx.run.model)
    from mlm_tasks.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    train, validation = encode(tokenizer, task.train, 32), encode(tokenizer, task.validation, 32)
    again = finetune(tokenizer_dir, train, validation, 2, cfg.downstream, 42, True)
    first = sst["pretrained"]["runs"][0]
    assert {k: again[k] for k in ("accuracy", "f1", "final_loss")} == {
        k: first[k] for k in ("accuracy", "f1", "final_loss")
    }

    # A rerun with the same settings (the gate's thresholds aside) reuses the file; others score again.
    assert downstream(_cfg(tmp_path, task_files, min_scores={"sst": 0.9}), ctx)["elapsed_s"] == result["elapsed_s"]
    fewer = _cfg(tmp_path, task_files, random_init=False, seeds=1)
    rerun = downstream(fewer, ctx)
    assert rerun["tasks"][0]["random_init"] is None and rerun["tasks"][0]["seeds"] == [42]


def test_no_tasks_no_work_and_no_model_needed(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    result = downstream(cfg, RunContext.of(cfg, "untrained"))
    assert result["tasks"] == [] and not storage.exists(RunPaths(str(tmp_path), "untrained").downstream)


def test_the_defaults_held_out_task_is_skipped_on_a_corpus_without_articles(tmp_path):
    """A run that switched the default's corpus on the form still runs; the table says why the task is missing."""
    (tmp_path / "c.txt").write_text("some text\n")
    cfg = build_config(
        {
            "output_root": str(tmp_path),
            "corpus": {"source": "local_files", "local_paths": [str(tmp_path / "c.txt")]},
            "downstream": {"tasks": [{"name": "which_article", "source": "held_out_article"}]},
        }
    )
    ctx = RunContext.of(cfg, "switched")
    save_tiny_encoder(ctx.run.model)
    result = downstream(cfg, ctx)
    assert result["tasks"] == [] and result["skipped"][0]["name"] == "which_article"
    page = storage.read_text(report(cfg, ctx)["report_uri"])
    assert (
        "- which_article: skipped (held_out_article needs a corpus of articles, and corpus.source is "
        "local_files)" in page
    )


def _result(means: dict[str, float], budget: dict | None = None) -> dict:
    def runs(mean):
        return {"mean": mean, "std": 0.01, "min": mean, "max": mean, "runs": []}

    return {
        "tasks": [
            {
                "name": name,
                "metric": "accuracy",
                "seeds": [42, 43],
                "budget": budget or dict(BUDGET),
                "examples": {"train": 32, "validation": 16},
                "labels": ["0", "1"],
                "pair": False,
                "source": "files",
                "min_score": None,
                "pretrained": runs(mean),
                "random_init": runs(0.5),
            }
            for name, mean in means.items()
        ],
        "skipped": [],
        "model": "m",
        "settings": {},
        "elapsed_s": 1.0,
    }


def test_gate_holds_each_task_to_its_minimum(tmp_path, task_files):
    cfg = _cfg(tmp_path, task_files, min_scores={"sst": 0.8})
    cfg.downstream.tasks[1].min_score = 0.6
    no_compare = GateConfig(require_better_than_published=False)
    decision = evaluate_gate(METRICS, no_compare, None, _result({"sst": 0.75, "pairs": 0.7}), cfg.downstream)
    assert not decision["passed"]
    assert decision["reasons"][0] == "downstream sst: accuracy 0.7500 (mean of 2 seeds) is below its min_score 0.8000."
    assert "downstream pairs: accuracy 0.7000 meets its min_score 0.6000." in decision["reasons"]
    assert evaluate_gate(METRICS, no_compare, None, _result({"sst": 0.85, "pairs": 0.7}), cfg.downstream)["passed"]

    # Through the step: no downstream.json yet means no score, which fails a configured minimum.
    run = make_run(str(tmp_path), "gated")
    ctx = RunContext(run.output_root, run.run_id)
    missing = gate(cfg, ctx)
    assert not missing["passed"] and "run the downstream step before the gate" in missing["reasons"][0]
    storage.write_json(run.downstream, _result({"sst": 0.9, "pairs": 0.65}))
    assert gate(cfg, ctx)["passed"]


def test_gate_refuses_a_regression_against_the_published_model(tmp_path, task_files):
    cfg = _cfg(tmp_path, task_files, max_regression=0.02)
    previous = {
        **METRICS,
        "run_id": "old",
        "downstream": {"sst": {"metric": "accuracy", "mean": 0.80, "std": 0.01, "budget": dict(BUDGET)}},
    }
    worse = evaluate_gate(METRICS, GateConfig(), previous, _result({"sst": 0.77}), cfg.downstream)
    assert not worse["passed"] and worse["reasons"][0].startswith(
        "downstream sst: accuracy 0.7700 is worse than the previously published 0.8000 (run old)"
    )
    assert evaluate_gate(METRICS, GateConfig(), previous, _result({"sst": 0.79}), cfg.downstream)["passed"]
    other_budget = evaluate_gate(
        METRICS, GateConfig(), previous, _result({"sst": 0.5}, {**BUDGET, "steps": 99}), cfg.downstream
    )
    assert other_budget["passed"] and any("budget differs" in r for r in other_budget["reasons"])

    # publish keeps the scores beside the eval metrics, where the next run's gate reads them.
    from mlm_tasks.downstream.scores import published_scores

    kept = published_scores(_result({"sst": 0.8}))
    assert kept == {"sst": {"metric": "accuracy", "mean": 0.8, "std": 0.01, "budget": BUDGET}}
    repo = "tester/roberta"
    storage.write_json(paths.published_metrics(str(tmp_path), repo), {**previous, "downstream": kept})
    cfg_repo = build_config({**cfg.model_dump(mode="json"), "publish": {"repo_id": repo}})
    run = make_run(str(tmp_path), "next", metrics=dict(METRICS))
    storage.write_json(run.downstream, _result({"sst": 0.70}))
    assert not gate(cfg_repo, RunContext(run.output_root, run.run_id))["passed"]


def test_report_and_card_show_the_table(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    run = make_run(str(tmp_path), "shown")
    result = _result({"sst": 0.8125})
    result["tasks"][0]["random_init"] = {**result["tasks"][0]["random_init"], "mean": 0.5, "std": 0.0625}
    storage.write_json(run.downstream, result)
    key = report(cfg, RunContext(run.output_root, run.run_id))
    page = storage.read_text(key["report_uri"])
    row = "| sst | accuracy | 0.8125 ± 0.0100 | 2 | 0.5000 ± 0.0625 | +0.3125 | 32 train, 16 scored |"
    assert "## Downstream tasks" in page and row in page and key["downstream"] == {"sst": 0.8125}
    card = render_model_card(cfg, run.run_id, METRICS, None, None, None, copy.deepcopy(result))
    assert "## Downstream evaluation" in card and row in card and "6 steps of 8 examples" in card
    no_table = render_model_card(cfg, run.run_id, METRICS, None, None, None)
    assert "No downstream evaluation was recorded" in no_table
