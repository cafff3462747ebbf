"""Issue 31, one bill for the run: every TPU VM a run had (each replaced node, the last one the teardown
deleted) is in summary.txt, report.md and the model card, with the total; a bill written before the
last VM is gone says it is not complete. The bill itself is runs/<run>/tpu_vm.json (mlm_tasks/tpu/prices.py),
written by the TPU VM operators (tests/plugins/test_tpu_operators.py)."""

from __future__ import annotations

import pytest

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.card import read_run_artifacts, render_model_card, training_lines
from mlm_tasks.steps.summary import summary
from mlm_tasks.tpu import prices

HOUR = 3600.0


@pytest.fixture
def tpu_run(gcs_root):
    cfg = build_config(
        {
            "output_root": gcs_root,
            "compute": "tpu_vm",
            "tpu": {"project": "p", "zone": "us-central2-b", "accelerator_type": "v4-8", "spot": True},
            "publish": {"repo_id": "ml-team/roberta-spot"},
        }
    )
    return cfg, RunContext.of(cfg, "spot-run", "fp0")


def _data() -> dict:
    """merge_shards' summary, as little of it as the summary step reads."""
    return {
        "fingerprint": "fp0",
        "corpus": {"source": "embedded_wiki", "articles": 12, "rows": 100, "characters": 5000},
        "vocab_size": 1000,
        "shards": {"train": 1},
        "records": {"train": 10},
        "tokens": {"train": 640},
    }


def test_summary_report_and_card_count_every_vm_of_the_run(tpu_run):
    cfg, ctx = tpu_run
    preempted = prices.vm_bill(cfg.tpu, "mlm-spot-run", 0, 2 * HOUR, "PREEMPTED, replaced")
    last = prices.vm_bill(cfg.tpu, "mlm-spot-run", 3 * HOUR, 4 * HOUR)  # deleted by the teardown
    storage.write_json(ctx.run.tpu_vm_bill, prices.run_bill(prices.run_bill(None, preempted), last))
    spot_rate = 4 * prices.LIST_PRICES["v4"]["spot"]  # 4 chips at the Spot price, per hour

    text = summary(cfg, ctx, data=_data())["text"]
    line = next(x for x in text.splitlines() if x.startswith("TPU VMs"))
    assert f"2 TPU VMs up 3.00 h = ${3 * spot_rate:,.2f} (v4-8 Spot" in line, line
    assert "mlm-spot-run 2.00 h, PREEMPTED, replaced; mlm-spot-run 1.00 h, deleted" in line and "so far" not in line
    assert line in storage.read_text(ctx.run.summary_text)

    bill = read_run_artifacts(ctx.run)["bill"]
    lines = training_lines(None, bill)  # the report's and the card's Training section
    assert lines[1] == f"- TPU VMs: 2, up 3.00 h in all, ${3 * spot_rate:,.2f} (v4-8 Spot, {prices.source(cfg.tpu)})"
    assert lines[2].endswith(", PREEMPTED, replaced") and lines[3].endswith(", deleted") and len(lines) == 4
    assert f"{2 * spot_rate:,.2f}" in lines[2] and "(v4-8, Spot)" in lines[2]
    card = render_model_card(cfg, "spot-run", None, None, None, None, None, bill)
    assert all(x in card for x in lines[1:])


def test_a_bill_without_the_last_vm_says_so_and_no_bill_is_said_too(tpu_run):
    cfg, ctx = tpu_run
    assert "TPU VMs    none recorded yet: delete_tpu_vm adds" in summary(cfg, ctx, data=_data())["text"]
    assert training_lines(None, None) == ["_No training summary was recorded for this run._"]  # a CPU run: no line

    preempted = prices.vm_bill(cfg.tpu, "mlm-spot-run", 0, HOUR, "PREEMPTED, replaced")
    storage.write_json(ctx.run.tpu_vm_bill, prices.run_bill(None, preempted))  # the last VM is still up
    assert "1 TPU VM up 1.00 h" in summary(cfg, ctx, data=_data())["text"]
    bill = read_run_artifacts(ctx.run)["bill"]
    assert not prices.bill_complete(bill)
    assert "so far (the VM still up is added when delete_tpu_vm deletes it)" in training_lines(None, bill)[1]


def test_the_restarts_of_each_try_are_in_the_training_section():
    restarts = [
        {"cause": "node PREEMPTED", "at_utc": "2026-12-01T10:00:00Z", "node": "n", "try_number": 1, "step": 22,
         "resumed_from": 20, "steps_lost": 2},
        {"cause": "node PREEMPTED", "at_utc": "2026-12-01T11:00:00Z", "node": "n", "try_number": 1, "step": 73,
         "resumed_from": 70, "steps_lost": 3},
    ]  # fmt: skip
    lines = training_lines({"steps": 200}, None, restarts)
    assert "- Restarts in try 1: 2 (train.max_restarts), 5 steps trained again" in lines
    assert "  - 2026-12-01T11:00:00Z: node PREEMPTED at step 73; resumed from step 70" in lines
    assert not [x for x in training_lines({"steps": 200}) if "Restarts" in x]  # none: no line
