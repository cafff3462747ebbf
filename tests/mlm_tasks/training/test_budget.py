"""train.budget_minutes: the step count comes from the run's measured step time, is recorded, and a
retry keeps it, so a faulted budgeted run trains exactly as a run given that count from the start; the
budget is a deadline, so the count is re-planned as the machine's pace changes and the run stops on time.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/training/test_budget.py -q
"""

import logging
import time

import pytest

from mlm_tasks import storage
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.training.budget import PACE_WINDOW_S, Deadline, budgeted_steps, seconds_per_step
from mlm_tasks.training.hooks import FailAtStep, TrainHook
from mlm_tasks.training.progress import read_history
from peers.tiny_data import tiny_config


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_budgeted_run_keeps_its_count_across_a_retry_and_trains_as_that_count_would(tiny_prepared, caplog):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    common = {"train.log_every": 1, "train.checkpoint_every": 5, "train.device": "cpu"}
    # 2 min, capped at 60 steps (train.steps): the measuring takes ~10 s here (~30 s beside CI), a step ~15 ms.
    budgeted = tiny_config(cfg.output_root, **common, **{"train.budget_minutes": 2, "train.steps": 60})
    ctx = RunContext.of(budgeted, "budgeted", data["fingerprint"])
    caplog.set_level(logging.INFO, logger="mlm_tasks")
    with pytest.raises(RuntimeError, match="Injected fault"):
        train(budgeted, ctx, hooks=[FailAtStep(7)])
    record = storage.read_json(ctx.run.train_budget)
    assert 8 <= record["steps"] <= 60 and record["seconds_per_step"] > 0 and record["budget_minutes"] == 2
    summary = train(budgeted, ctx)  # the retry: resumes from step 5 with the recorded count
    assert summary["steps"] == record["steps"] == 60 and summary["resumed_from_step"] == 5
    ended = storage.read_json(ctx.run.train_budget)
    assert {k: ended[k] for k in record} == record and ended["trained_steps"] == 60 and ended["overrun_s"] < 0
    # The retry got the rest of the budget: what the fault's try used up to its checkpoint, not the time between.
    assert 0 < ended["trained_s"] < ended["ended_at"] - record["started_at"]
    assert "kept on this try" in caplog.text

    fixed = tiny_config(cfg.output_root, **common, **{"train.steps": record["steps"]})
    train(fixed, RunContext.of(fixed, "fixed", data["fingerprint"]))
    losses = [h["loss"] for h in read_history(RunPaths(cfg.output_root, "budgeted"))]
    assert losses == pytest.approx(
        [h["loss"] for h in read_history(RunPaths(cfg.output_root, "fixed"))], rel=1e-6, abs=1e-6
    )


class _Slowdown(TrainHook):
    """A machine that gets busier: every call from step `after` on takes `extra_s` longer."""

    def __init__(self, after: int, extra_s: float):
        self.after, self.extra_s = after, extra_s

    def on_steps(self, first: int, last: int) -> None:
        if last >= self.after:
            time.sleep(self.extra_s)


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_budgeted_run_that_slows_down_stops_at_the_deadline_with_its_checkpoint_and_a_decayed_rate(tiny_prepared):
    """The start's plan is for the pace measured then; the machine then gets ~4x slower. The run re-plans,
    stops at a step boundary near the deadline (its last step validated and checkpointed), the learning
    rate reaches ~0 at the step it stopped, and budget.json says how many steps a `train.steps` rerun takes."""
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    budgeted = tiny_config(
        cfg.output_root,
        **{"train.log_every": 10, "train.checkpoint_every": 50, "train.eval_every": 40, "train.device": "cpu"},
        **{"train.budget_minutes": 0.75, "train.steps": None},  # 45 s, ~10 s of it measuring (~30 s beside CI)
    )
    ctx = RunContext.of(budgeted, "slowed", data["fingerprint"])
    summary = train(budgeted, ctx, hooks=[_Slowdown(after=60, extra_s=0.05)])
    record = storage.read_json(ctx.run.train_budget)
    assert summary["steps"] == record["trained_steps"] < record["steps"] and record["replans"] >= 1
    # Not a timing test (those live in bench/): the bound only says the run did not go on to its first plan.
    assert record["trained_s"] < 45 * 1.25, record
    history = read_history(ctx.run)
    last = history[-1]
    assert last["step"] == summary["steps"] and "val_loss" in last  # the last step has its entry and validation
    assert last["learning_rate"] < 0.05 * budgeted.train.learning_rate  # annealed by the end, not cut off high
    assert storage.exists(f"{ctx.run.checkpoints}/ckpt-{summary['steps']}.index")
    assert storage.read_json(ctx.run.train_status)["total_steps"] == summary["steps"]


def test_the_count_is_what_fits_less_the_measuring_and_train_steps_caps_it(tmp_path):
    run = RunPaths(str(tmp_path), "r")
    first = budgeted_steps(run, 1.0, None, lambda: (0.05, 6.0))
    assert first.steps == 1080 and first.seconds_per_step == 0.05  # (60 - 6) / 0.05
    again = budgeted_steps(run, 9.0, None, lambda: pytest.fail("measured again"))
    assert again == first  # recorded: kept, deadline and all
    capped = RunPaths(str(tmp_path), "capped")
    assert budgeted_steps(capped, 1.0, 500, lambda: (0.05, 6.0)).steps == 500
    slow = RunPaths(str(tmp_path), "slow")
    assert budgeted_steps(slow, 0.01, None, lambda: (5.0, 2.0)).steps == 1  # at least one step


def test_the_measuring_stops_at_its_share_of_the_budget_on_a_slow_machine():
    """A machine so busy that 50 steps take longer than the cap: the measuring stops at the cap (one timed call
    at least), the second warm-up call is skipped once the first has used it, and the pace is still measured."""

    class _Strategy:
        def distribute_datasets_from_function(self, batches):
            return iter(range(10**6))

    calls = []

    def step_functions(strategy, model, optimizer, max_pred, xla):
        def run_steps(iterator, n):
            calls.append(n)
            time.sleep(0.3 if len(calls) == 1 else 0.05)  # compiling, then 50 ms a call of 2 steps

            class _Done:
                def numpy(self):
                    return 0

            return _Done()

        return run_steps

    step_s, spent_s = seconds_per_step(_Strategy(), step_functions(None, None, None, 1, False), None, 2, max_s=0.5)
    assert 0.5 <= spent_s < 0.8 and len(calls) in range(4, 7), (spent_s, calls)
    assert 0.02 <= step_s < 0.05  # 50 ms per call of 2 steps
    calls.clear()
    _, spent_s = seconds_per_step(_Strategy(), step_functions(None, None, None, 1, False), None, 2, max_s=0.2)
    assert len(calls) == 2 and spent_s < 0.5  # the compile used the cap: no second warm-up, one timed call


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _drive(deadline: Deadline, clock: _Clock, total: int, seconds_per_step, per_call: int = 1, compile_s=5.0):
    """Runs a loop as TrainLoop does: re-plan before each call, then the call takes its steps' time."""
    step = 0
    while (total := deadline.total_before_call(step, per_call, total, reserve_s=1.0)) > step:
        calls = min(per_call, total - step)
        clock.now += sum(seconds_per_step(s) for s in range(step + 1, step + calls + 1))
        if step == 0:
            clock.now += compile_s
        step += calls
    return step


def test_a_machine_that_slows_down_gets_fewer_steps_and_still_ends_by_the_deadline():
    clock = _Clock()
    deadline_at = clock.now + 300  # a 5-minute budget, measured at 0.25 s/step: 1,200 steps planned
    pace = lambda step: 0.25 if step < 400 else 0.5  # noqa: E731  the machine gets busier at step 400
    deadline = Deadline(deadline_at, 0.25, cap=None, clock=clock)
    steps = _drive(deadline, clock, 1200, pace)
    assert clock.now <= deadline_at and deadline_at - clock.now < 1.0 + 2 * 0.5  # the reserve and a step
    assert 400 < steps < 1200 and deadline.replans > 1
    assert deadline.pace() == pytest.approx(0.5)  # the window only holds the last minute's calls


def test_a_faster_machine_trains_more_steps_a_cap_holds_and_a_late_start_trains_one_step():
    clock = _Clock()
    fast = Deadline(clock.now + 300, 0.25, cap=None, clock=clock)
    assert _drive(fast, clock, 1200, lambda step: 0.2) > 1400  # (300 - 5 - 1) / 0.2 ≈ 1,470
    clock = _Clock()
    capped = Deadline(clock.now + 300, 0.25, cap=1250, clock=clock)
    assert _drive(capped, clock, 1200, lambda step: 0.2) == 1250
    clock = _Clock()
    late = Deadline(clock.now - 10, 0.25, cap=None, clock=clock)  # a retry after the deadline
    assert _drive(late, clock, 1200, lambda step: 0.25) == 1
    clock = _Clock()
    calls = Deadline(clock.now + 300, 0.25, cap=None, clock=clock)  # 64 steps a call (a TPU)
    steps = _drive(calls, clock, 1200, lambda step: 0.25, per_call=64)
    assert clock.now <= clock.now + 300 and PACE_WINDOW_S > 0 and steps > 1000


def test_the_schedule_is_transformers_until_a_replan_and_a_replan_keeps_the_rate_continuous(tmp_path):
    from transformers import create_optimizer

    from mlm_tasks.model.roberta import optimizer_and_schedule

    cfg = tiny_config(tmp_path, **{"train.learning_rate": 0.002, "train.warmup_fraction": 0.1})
    _, ours = optimizer_and_schedule(cfg.train, 1000)
    _, theirs = create_optimizer(init_lr=0.002, num_train_steps=1000, num_warmup_steps=100, weight_decay_rate=0.01)
    for step in (0, 1, 50, 99, 100, 101, 500, 999, 1000):
        assert float(ours(step)) == pytest.approx(float(theirs(step)), rel=1e-6, abs=1e-12)
    before = float(ours(600))
    ours.replan(600, 800)  # the machine slowed: the run now ends at step 800
    assert float(ours(600)) == pytest.approx(before) and float(ours(700)) == pytest.approx(before / 2)
    assert float(ours(800)) == pytest.approx(0, abs=1e-9) and ours.total == 800
    ours.replan(50, 900)  # during warmup only the end moves
    assert float(ours(50)) == pytest.approx(0.001) and float(ours(100)) == pytest.approx(0.002)
