"""The downstream step end to end on a tiny encoder and tiny tasks (tens of examples, a few steps, 2 seeds):
the table's fields, the random-init baseline, determinism per seed, reuse on a rerun; the gate's minimum
scores and its comparison with the last published model; the table in the report and the model card."""

from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pytest

from mlm_tasks import paths, storage
from mlm_tasks.config import GateConfig, build_config
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.reporting.card import render_model_card
from mlm_tasks.reporting.gate import evaluate_gate
from mlm_tasks.steps.downstream import downstream
from mlm_tasks.steps.gate import gate
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
    # Each score has its interval over seeds and examples; 16 scored examples are flagged as too few to compare.
    for entry in (sst, pairs):
        lo, hi = entry["pretrained"]["interval"]
        assert lo <= entry["pretrained"]["mean"] <= hi and len(
            entry["pretrained"]["runs"][0]["predictions"]
        ) == 16 + 8 * (entry is pairs)
    assert (
        sst["warnings"] and "over 16 scored examples, wider than downstream.max_half_width ±0.1" in sst["warnings"][0]
    )
    # The two models are different starting points: under one seed, different encoder weights. (Not their final
    # losses: a mean of six bf16-rounded losses near ln 2 can tie, as it did once under a bf16 policy.)
    import tensorflow as tf

    from mlm_tasks.downstream.finetune import _model

    starts = []
    for pretrained in (True, False):
        tf.keras.utils.set_random_seed(42)
        model = _model(storage.local_path(ctx.run.model), 2, pretrained)
        model(model.dummy_inputs)
        starts.append(model.trainable_weights[0].numpy())
    assert starts[0].shape == starts[1].shape and not np.array_equal(*starts)

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


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_regression_task_fine_tunes_one_output_and_is_scored_by_correlation(tmp_path):
    """...and its scored text is looked for in the pretraining corpus: a sentence the corpus's train split holds
    is named in the entry and its warnings."""
    from mlm_tasks.data.corpus.base import split_of

    sentences = [f"{r['sentence']} and then {r['sentence']}" for r in sentiment_rows(40, 3)]  # 14 words each
    rows = [{"sentence": s, "label": (i % 2) * 4 + (i % 5) / 5} for i, s in enumerate(sentences)]
    (tmp_path / "sts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    copied = next(s for s in sentences if split_of(s, 0.05, 0.05) == "train")  # lands in the train split
    filler = [f"line {i} of a corpus that has nothing of the task in it, here for the splits" for i in range(30)]
    (tmp_path / "corpus.txt").write_text("\n".join([*filler, copied]) + "\n")
    task = {"name": "sts", "train_file": str(tmp_path / "sts.jsonl"), "validation_file": str(tmp_path / "sts.jsonl")}
    cfg = build_config(
        {
            "output_root": str(tmp_path),
            "corpus": {"source": "local_files", "local_paths": [str(tmp_path / "corpus.txt")]},
            "downstream": {**BUDGET, "random_init": False, "tasks": [{**task, "metric": "pearson"}]},
        }
    )
    ctx = RunContext.of(cfg, "sts")
    save_tiny_encoder(ctx.run.model)
    (sts,) = downstream(cfg, ctx)["tasks"]
    assert sts["regression"] and sts["labels"] == [] and sts["metric"] == "pearson"
    for run in sts["pretrained"]["runs"]:
        assert set(run) >= {"pearson", "spearman"} and "accuracy" not in run and -1 <= run["pearson"] <= 1
        assert len(run["predictions"]) == 40 and any(p != round(p) for p in run["predictions"])  # values, not classes
    from mlm_tasks.downstream.metrics import score

    for run in sts["pretrained"]["runs"]:  # the predictions kept are the ones scored: the gate rescores them
        assert score("pearson", run["predictions"], sts["validation_labels"], 1) == run["pearson"]
    assert -1 <= sts["pretrained"]["interval"][0] <= sts["pretrained"]["interval"][1] <= 1
    assert sts["contamination"]["found"] == 1 and sts["contamination"]["examples"] == [copied]
    assert any(w.startswith("sts: 1 of 40 scored examples share a 13-word sequence") for w in sts["warnings"])


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
        return {"mean": mean, "std": 0.01, "min": mean, "max": mean, "interval": [mean - 0.03, mean + 0.03], "runs": []}

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


def _scored(name: str, rates: list[float], n: int = 400, seed: int = 0, budget: dict | None = None) -> dict:
    """A downstream.json entry whose seeds predict `rates` of n balanced binary examples right (each seed its
    own random subset of the examples): the predictions the interval and the paired comparison read."""
    from mlm_tasks.downstream.metrics import score
    from mlm_tasks.downstream.uncertainty import examples_fingerprint, interval

    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    runs = []
    for i, rate in enumerate(rates):
        right = rng.permutation(n) < round(rate * n)
        predictions = np.where(right, labels, 1 - labels)
        runs.append({"seed": 42 + i, "accuracy": score("accuracy", predictions, labels, 2), "predictions": predictions})
    values = [r["accuracy"] for r in runs]
    mean = float(np.mean(values))
    texts = [f"example {i}" for i in range(n)]
    return {
        "name": name,
        "metric": "accuracy",
        "seeds": [r["seed"] for r in runs],
        "budget": budget or dict(BUDGET),
        "examples": {"train": 1000, "validation": n},
        "validation_fingerprint": examples_fingerprint(texts, None, labels.tolist()),
        "validation_labels": labels.tolist(),
        "labels": ["0", "1"],
        "pair": False,
        "regression": False,
        "source": "files",
        "min_score": None,
        "pretrained": {
            "mean": mean,
            "std": float(np.std(values, ddof=1)),
            "min": min(values),
            "max": max(values),
            "interval": list(interval("accuracy", [r["predictions"] for r in runs], labels, 2)),
            "runs": [{**r, "predictions": r["predictions"].tolist()} for r in runs],
        },
        "random_init": None,
        "warnings": [],
    }


def _published(entry: dict) -> dict:
    from mlm_tasks.downstream.scores import published_scores

    return {**METRICS, "run_id": "old", "downstream": published_scores({"tasks": [entry]})}


def test_the_gate_decides_on_the_difference_beyond_noise(tmp_path, task_files):
    """400 scored examples, 3 seeds: a candidate equal to the published model up to noise passes (its mean is
    lower by chance); one lower by more than the paired interval allows fails; the rule is named."""
    cfg = _cfg(tmp_path, task_files)  # max_regression 0: fail only a drop noise cannot explain
    previous = _published(_scored("sst", [0.80, 0.81, 0.79], seed=1))

    equal = evaluate_gate(
        METRICS, GateConfig(), previous, {"tasks": [_scored("sst", [0.79, 0.80, 0.785])]}, cfg.downstream
    )
    reason = next(r for r in equal["reasons"] if r.startswith("downstream sst"))
    assert equal["passed"] and "paired bootstrap over the same 400 examples" in reason, reason
    assert reason.endswith("equal within noise."), reason

    worse = evaluate_gate(
        METRICS, GateConfig(), previous, {"tasks": [_scored("sst", [0.72, 0.73, 0.71])]}, cfg.downstream
    )
    assert not worse["passed"], worse
    assert worse["reasons"][0].startswith(
        "downstream sst: accuracy 0.7200 against the previously published 0.8000 (run old), difference -0.0800"
    ) and worse["reasons"][0].endswith("beyond noise."), worse["reasons"][0]

    # Allowed to fall by 0.1 (max_regression), the same drop passes, and says it is lower.
    lenient = _cfg(tmp_path, task_files, max_regression=0.1)
    allowed = evaluate_gate(
        METRICS, GateConfig(), previous, {"tasks": [_scored("sst", [0.72, 0.73, 0.71])]}, lenient.downstream
    )
    assert allowed["passed"] and any("lower, but within downstream.max_regression 0.1" in r for r in allowed["reasons"])

    better = evaluate_gate(
        METRICS, GateConfig(), previous, {"tasks": [_scored("sst", [0.88, 0.87, 0.89])]}, cfg.downstream
    )
    assert better["passed"] and any(r.endswith("better, beyond noise.") for r in better["reasons"])

    # Scored on other examples: the pairing does not apply, and the two intervals decide (wider).
    other = _scored("sst", [0.76, 0.77, 0.75], seed=2)
    other["validation_fingerprint"] = "another-set"
    unpaired = evaluate_gate(METRICS, GateConfig(), previous, {"tasks": [other]}, cfg.downstream)
    reason = next(r for r in unpaired["reasons"] if r.startswith("downstream sst"))
    assert unpaired["passed"] and "from the two scores' intervals" in reason, reason

    # Another fine-tuning budget is another measurement: not compared.
    other_budget = evaluate_gate(
        METRICS,
        GateConfig(),
        previous,
        {"tasks": [_scored("sst", [0.5], budget={**BUDGET, "steps": 99})]},
        cfg.downstream,
    )
    assert other_budget["passed"] and any("budget differs" in r for r in other_budget["reasons"])


def test_the_published_scores_carry_what_the_next_gate_pairs_with(tmp_path, task_files):
    """publish keeps the scores beside the eval metrics (published/<repo>/metrics.json), predictions included;
    the next run's gate reads them there."""
    cfg = _cfg(tmp_path, task_files)
    old = _scored("sst", [0.80, 0.81, 0.79], seed=1)
    previous = _published(old)
    kept = previous["downstream"]["sst"]
    assert kept["predictions"] == [r["predictions"] for r in old["pretrained"]["runs"]]
    assert (
        kept["validation_fingerprint"] == old["validation_fingerprint"]
        and kept["interval"] == old["pretrained"]["interval"]
    )
    repo = "tester/roberta"
    storage.write_json(paths.published_metrics(str(tmp_path), repo), previous)
    cfg_repo = build_config({**cfg.model_dump(mode="json"), "publish": {"repo_id": repo}})
    run = make_run(str(tmp_path), "next", metrics=dict(METRICS))
    storage.write_json(run.downstream, {"tasks": [_scored("sst", [0.70, 0.71, 0.69])], "skipped": []})
    assert not gate(cfg_repo, RunContext(run.output_root, run.run_id))["passed"]
    # A model published before intervals existed (mean and spread only) is compared by its mean.
    legacy = {
        **METRICS,
        "downstream": {"sst": {"metric": "accuracy", "mean": 0.8, "std": 0.01, "budget": dict(BUDGET)}},
    }
    decision = evaluate_gate(METRICS, GateConfig(), legacy, {"tasks": [_scored("sst", [0.70])]}, cfg.downstream)
    assert not decision["passed"] and "means alone" in decision["reasons"][0]


def test_report_and_card_show_the_table(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    run = make_run(str(tmp_path), "shown")
    result = _result({"sst": 0.8125})
    result["tasks"][0]["random_init"] = {**result["tasks"][0]["random_init"], "mean": 0.5, "std": 0.0625}
    storage.write_json(run.downstream, result)
    key = report(cfg, RunContext(run.output_root, run.run_id))
    page = storage.read_text(key["report_uri"])
    row = (
        "| sst | accuracy | 0.8125 ± 0.0100 | [0.7825, 0.8425] | 2 | 0.5000 ± 0.0625 [0.4700, 0.5300] | +0.3125 "
        "| 32 train, 16 scored |"
    )
    assert "## Downstream tasks" in page and row in page and key["downstream"] == {"sst": 0.8125}
    card = render_model_card(cfg, run.run_id, {"metrics": METRICS, "downstream": copy.deepcopy(result)})
    assert "## Downstream evaluation" in card and row in card and "6 steps of 8 examples" in card
    no_table = render_model_card(cfg, run.run_id, {"metrics": METRICS})
    assert "No downstream evaluation was recorded" in no_table
