"""The gate's rules: thresholds, and "not worse than the model last published" (pure, no I/O)."""

from __future__ import annotations

from mlm_tasks.config import GateConfig
from mlm_tasks.reporting.gate import evaluate_gate


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
