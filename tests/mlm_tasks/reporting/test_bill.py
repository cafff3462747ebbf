"""What a TPU run cost, as a person reads it: the training's hours at the run's price (mlm_tasks/tpu/prices.py),
an estimate that names its price, in summary.txt, report.md and the model card; and the restarts of each try.
The plan's estimate before the run spends is tested in tests/mlm_tasks/model/test_flops.py."""

from __future__ import annotations

import pytest

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.card import render_model_card, training_lines
from mlm_tasks.steps.summary import summary
from mlm_tasks.tpu import prices
from mlm_tasks.training.finish import _tpu_cost

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


def _train_summary(cfg, elapsed_s: float) -> dict:
    """The fields of a TPU run's train summary that the summary and the card read, costed as train() does."""
    hours, cost, basis = _tpu_cost(cfg, "tpu", elapsed_s)
    return {
        "steps": 2000, "device": "tpu", "global_batch": 512, "replicas": 4, "parameters": 124_000_000,
        "tokens_per_s": 50_000.0, "first_loss": 10.5, "last_loss": 4.1, "elapsed_s": elapsed_s,
        "resumed_from_step": 0, "mfu_of": "31% MFU of 4 x 275 TFLOP/s bf16 peak",
        "accelerator_hours": hours, "cost_usd": cost, "cost_basis": basis,
    }  # fmt: skip


def test_summary_report_and_card_give_the_runs_estimate_with_its_price(tpu_run):
    cfg, ctx = tpu_run
    storage.write_json(ctx.run.train_summary, _train_summary(cfg, 2 * HOUR))
    spot_rate = 4 * prices.LIST_PRICES["v4"]["spot"]  # 4 chips at the Spot price, per hour
    source = "list price 2025-11, cloud.google.com/tpu/pricing"
    assert prices.source(cfg.tpu) == source

    text = summary(cfg, ctx, data=_data())["text"]
    line = next(x for x in text.splitlines() if x.startswith("Hardware"))
    assert f"2.00 TPU hours of training = ${2 * spot_rate:,.2f} (v4-8 Spot, {source}; an estimate" in line, line
    assert line in storage.read_text(ctx.run.summary_text)

    lines = training_lines(storage.read_json(ctx.run.train_summary))  # the report's and the card's Training section
    cost = f"- Accelerator cost: ${2 * spot_rate:,.2f} for 2.00 h of training (v4-8 Spot, {source})"
    assert cost in lines
    assert cost in render_model_card(cfg, "spot-run", {"summary": storage.read_json(ctx.run.train_summary)})

    # A deployment's own price replaces the list price, and says so.
    own = cfg.model_copy(update={"tpu": cfg.tpu.model_copy(update={"price_per_chip_hour": 1.5})})
    storage.write_json(ctx.run.train_summary, _train_summary(own, HOUR))
    assert "= $6.00 (v4-8 Spot, tpu.price_per_chip_hour $1.5;" in summary(own, ctx, data=_data())["text"]


def test_a_cpu_run_has_no_cost_line(tpu_run):
    cfg, ctx = tpu_run
    assert _tpu_cost(cfg, "cpu", HOUR) == (None, None, None)
    assert training_lines(None) == ["_No training summary was recorded for this run._"]
    assert not [x for x in summary(cfg, ctx, data=_data())["text"].splitlines() if "TPU hours" in x]


def test_the_restarts_of_each_try_are_in_the_training_section():
    restarts = [
        {"cause": "node PREEMPTED", "at_utc": "2026-12-01T10:00:00Z", "node": "n", "try_number": 1, "step": 22,
         "resumed_from": 20, "steps_lost": 2},
        {"cause": "node PREEMPTED", "at_utc": "2026-12-01T11:00:00Z", "node": "n", "try_number": 1, "step": 73,
         "resumed_from": 70, "steps_lost": 3},
    ]  # fmt: skip
    lines = training_lines({"steps": 200}, restarts)
    assert "- Restarts in try 1: 2 (train.max_restarts), 5 steps trained again" in lines
    assert "  - 2026-12-01T11:00:00Z: node PREEMPTED at step 73; resumed from step 70" in lines
    assert not [x for x in training_lines({"steps": 200}) if "Restarts" in x]  # none: no line
