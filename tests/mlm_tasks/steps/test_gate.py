"""The evaluation gate: thresholds, and "not worse than the model last published" — end to end with
publishing against the fake Hub, so a worse model is really not pushed and a better one is."""

from __future__ import annotations

from mlm_tasks import paths, storage
from mlm_tasks.config import GateConfig, build_config
from mlm_tasks.paths import RunContext
from mlm_tasks.steps.gate import evaluate_gate, gate
from mlm_tasks.steps.publish import publish
from peers.run_artifacts import METRICS, make_run

REPO = "tester/roberta-wiki"


def test_thresholds_pass_and_fail_with_reasons():
    gate = GateConfig(max_eval_loss=5.0, min_accuracy=0.2, require_better_than_published=False)
    ok = evaluate_gate({"loss": 4.5, "accuracy": 0.3}, gate, None)
    assert ok["passed"] and len(ok["reasons"]) == 2

    high_loss = evaluate_gate({"loss": 5.5, "accuracy": 0.3}, gate, None)
    assert not high_loss["passed"]
    assert "above gate.max_eval_loss" in high_loss["reasons"][0]

    low_acc = evaluate_gate({"loss": 4.5, "accuracy": 0.1}, gate, None)
    assert not low_acc["passed"] and "below gate.min_accuracy" in low_acc["reasons"][0]


def test_missing_or_nan_metrics_fail_a_configured_threshold():
    gate = GateConfig(max_eval_loss=5.0, min_accuracy=0.2)
    decision = evaluate_gate({"loss": float("nan")}, gate, None)
    assert not decision["passed"]
    assert sum("missing or NaN" in r for r in decision["reasons"]) == 2


def test_not_worse_than_previously_published():
    gate = GateConfig()  # require_better_than_published defaults to True
    previous = {"loss": 4.0, "accuracy": 0.35, "run_id": "old-run"}

    worse_loss = evaluate_gate({"loss": 4.2, "accuracy": 0.40}, gate, previous)
    assert not worse_loss["passed"]
    assert "worse than the previously published 4.0000 (run old-run)" in worse_loss["reasons"][0]

    worse_acc = evaluate_gate({"loss": 3.9, "accuracy": 0.30}, gate, previous)
    assert not worse_acc["passed"] and "masked accuracy" in worse_acc["reasons"][0]

    assert evaluate_gate({"loss": 3.9, "accuracy": 0.36}, gate, previous)["passed"]
    # A rerun of the same model (float noise) is not "worse".
    assert evaluate_gate({"loss": 4.0 * (1 + 1e-9), "accuracy": 0.35 * (1 - 1e-9)}, gate, previous)["passed"]
    # With the comparison switched off only thresholds count.
    assert evaluate_gate({"loss": 9.0, "accuracy": 0.0}, GateConfig(require_better_than_published=False), previous)[
        "passed"
    ]


def test_first_model_has_nothing_to_beat():
    decision = evaluate_gate({"loss": 9.0, "accuracy": 0.01}, GateConfig(), None)
    assert decision["passed"]
    assert decision == {
        "passed": True,
        "reasons": ["no previously published model to compare with."],
        "warnings": [],
    }  # the XCom as is


def test_gate_without_eval_metrics_says_what_to_run(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    run = make_run(str(tmp_path), "no-eval", metrics=None)
    decision = gate(cfg, RunContext(run.output_root, run.run_id))
    assert not decision["passed"] and "run evaluate" in decision["reasons"][0]


def test_worse_model_is_not_published_and_better_one_is(tmp_path, fake_hub):
    root = str(tmp_path)
    cfg = build_config({"output_root": root, "publish": {"enabled": True, "repo_id": REPO}})
    runs = {
        "first": make_run(root, "first", metrics=dict(METRICS, loss=4.5, accuracy=0.30)),
        "worse": make_run(root, "worse", metrics=dict(METRICS, loss=4.8, accuracy=0.28)),
        "better": make_run(root, "better", metrics=dict(METRICS, loss=4.1, accuracy=0.33)),
    }
    decisions = {}
    for name, run in runs.items():  # the DAG's gate -> publish wiring, in order
        decisions[name] = gate(cfg, RunContext(run.output_root, run.run_id))
        if decisions[name]["passed"]:
            publish(cfg, RunContext(run.output_root, run.run_id), token=fake_hub.token)

    assert [d["passed"] for d in decisions.values()] == [True, False, True]
    assert "previously published" in decisions["worse"]["reasons"][0]
    assert [c.message for c in fake_hub.commits_to(REPO)] == [
        "Upload model from run first",
        "Upload model from run better",
    ]
    published = storage.read_json(paths.published_metrics(root, REPO))
    assert published["run_id"] == "better" and published["loss"] == 4.1
    assert published["commit_oid"] == fake_hub.commits[-1].oid
    assert not storage.exists(runs["worse"].published)
