"""train.budget_minutes: the step count comes from the run's measured step time, is recorded, and a
retry keeps it, so a faulted budgeted run trains exactly as a run given that count from the start.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/training/test_budget.py -q
"""

import logging

import pytest

from mlm_tasks import storage
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.training.budget import budgeted_steps
from mlm_tasks.training.hooks import FailAtStep
from mlm_tasks.training.progress import read_history
from peers.tiny_data import tiny_config


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_budgeted_run_keeps_its_count_across_a_retry_and_trains_as_that_count_would(tiny_prepared, caplog):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    common = {"train.log_every": 1, "train.checkpoint_every": 5, "train.device": "cpu"}
    # 30 s, capped at 60 steps (train.steps): the measuring takes ~10 s here, a step ~15 ms.
    budgeted = tiny_config(cfg.output_root, **common, **{"train.budget_minutes": 0.5, "train.steps": 60})
    ctx = RunContext.of(budgeted, "budgeted", data["fingerprint"])
    caplog.set_level(logging.INFO, logger="mlm_tasks")
    with pytest.raises(RuntimeError, match="Injected fault"):
        train(budgeted, ctx, hooks=[FailAtStep(7)])
    record = storage.read_json(ctx.run.train_budget)
    assert 8 <= record["steps"] <= 60 and record["seconds_per_step"] > 0 and record["budget_minutes"] == 0.5
    summary = train(budgeted, ctx)  # the retry: resumes from step 5 with the recorded count
    assert summary["steps"] == record["steps"] and summary["resumed_from_step"] == 5
    assert storage.read_json(ctx.run.train_budget) == record
    assert "kept on this try" in caplog.text

    fixed = tiny_config(cfg.output_root, **common, **{"train.steps": record["steps"]})
    train(fixed, RunContext.of(fixed, "fixed", data["fingerprint"]))
    losses = [h["loss"] for h in read_history(RunPaths(cfg.output_root, "budgeted"))]
    assert losses == pytest.approx(
        [h["loss"] for h in read_history(RunPaths(cfg.output_root, "fixed"))], rel=1e-6, abs=1e-6
    )


def test_the_count_is_what_fits_less_the_measuring_and_train_steps_caps_it(tmp_path):
    run = RunPaths(str(tmp_path), "r")
    assert budgeted_steps(run, 1.0, None, lambda: (0.05, 6.0)) == 1080  # (60 - 6) / 0.05
    assert budgeted_steps(run, 9.0, None, lambda: pytest.fail("measured again")) == 1080  # recorded: kept
    capped = RunPaths(str(tmp_path), "capped")
    assert budgeted_steps(capped, 1.0, 500, lambda: (0.05, 6.0)) == 500
    slow = RunPaths(str(tmp_path), "slow")
    assert budgeted_steps(slow, 0.01, None, lambda: (5.0, 2.0)) == 1  # at least one step
