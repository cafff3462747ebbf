"""The gate step end to end with publishing against the fake Hub, so a worse model is really not pushed
and a better one is (the rules themselves: tests/mlm_tasks/reporting/test_gate_rules.py)."""

from __future__ import annotations

from mlm_tasks import paths, storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import RunContext
from mlm_tasks.steps.gate import gate
from mlm_tasks.steps.publish import publish
from peers.run_artifacts import METRICS, make_run

REPO = "tester/roberta-wiki"


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
