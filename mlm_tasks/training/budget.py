"""train.budget_minutes: a run that ends on time on any machine. The step count is fixed once, from the
speed of the run's own step on this hardware, and recorded, so a resume keeps it and the run's
schedule (warmup, decay) is what a run given that count from the start would follow.

    steps = budgeted_steps(run, budget_minutes=5, cap=None, measure=lambda: (0.012, 4.1))

`measure()` returns (seconds per step, seconds spent measuring): train times a throwaway copy of the
model and optimizer for at least MEASURE_STEPS steps and MEASURE_S seconds after WARMUP_CALLS untimed
calls (the first compiles), on batches of the run's own input, then starts the real run from the seed. The count is
(budget - time spent measuring) / seconds per step, at most `cap` (train.steps, when set), at least 1.
It lands in runs/<run>/train/budget.json (RunPaths.train_budget) before the first step: every later try of
the run reads it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths

log = logging.getLogger(__name__)
# Right after compiling, the input pipeline and the kernels are not at their steady pace yet (measured
# on the embedded default: 20 steps / 3 s read fp32 steps 25-35% slow, bf16 ones 15-20% fast): a warm-up
# call more, then a longer window, which is ~3% of a 5-minute budget.
MEASURE_STEPS, MEASURE_S, WARMUP_CALLS = 50, 8.0, 2


def budgeted_steps(
    run: RunPaths, budget_minutes: float, cap: int | None, measure: Callable[[], tuple[float, float]]
) -> int:
    recorded = storage.read_json_if_exists(run.train_budget)
    if recorded:
        log.info(
            "Step count %d from the run's time budget (recorded %s: %.4f s/step, %g min): kept on this try",
            recorded["steps"],
            run.train_budget,
            recorded["seconds_per_step"],
            recorded["budget_minutes"],
        )
        return int(recorded["steps"])
    step_s, spent_s = measure()
    steps = max(1, int((budget_minutes * 60 - spent_s) / step_s))
    if cap is not None and steps > cap:
        log.info(
            "%d steps would fit train.budget_minutes=%g, but train.steps caps them at %d", steps, budget_minutes, cap
        )
        steps = cap
    storage.write_json(
        run.train_budget,
        {
            "steps": steps,
            "seconds_per_step": step_s,
            "measured_in_s": spent_s,
            "budget_minutes": budget_minutes,
            "cap": cap,
        },
    )
    log.info(
        "Time budget %g min: %.4f s/step measured in %.1f s, so %d steps (recorded in %s)",
        budget_minutes,
        step_s,
        spent_s,
        steps,
        run.train_budget,
    )
    return steps


def seconds_per_step(
    strategy: Any,
    model_and_optimizer: tuple[Any, Any],
    step_functions: Callable[..., Any],
    max_pred: int,
    xla: bool,
    batches: Callable[[Any], Any],
    per_call: int,
) -> tuple[float, float]:
    """(seconds per step, seconds spent) of a throwaway model and optimizer: WARMUP_CALLS calls (the first
    compiles), then calls of `per_call` steps until MEASURE_STEPS steps and MEASURE_S seconds have passed."""
    began = time.monotonic()
    model, optimizer = model_and_optimizer
    run_steps = step_functions(strategy, model, optimizer, max_pred, xla)
    iterator = iter(strategy.distribute_datasets_from_function(batches))
    for _ in range(WARMUP_CALLS):  # the first traces and compiles; neither is timed
        run_steps(iterator, per_call).numpy()
    steps, timed = 0, time.monotonic()
    while steps < MEASURE_STEPS or time.monotonic() - timed < MEASURE_S:
        run_steps(iterator, per_call).numpy()
        steps += per_call
    return (time.monotonic() - timed) / steps, time.monotonic() - began
