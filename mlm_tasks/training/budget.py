"""train.budget_minutes: a deadline on the time a run trains, from its first start (measuring included).
docs/google-cloud.md (`train.budget_minutes`)

    budget = budgeted_steps(run, minutes=5, cap=None, measure=lambda: (0.012, 4.1))  # recorded in budget.json
    deadline = Deadline(time.time() + budget.seconds - used_s, budget.seconds_per_step, cap=None)
    total = deadline.total_before_call(step, per_call, total, reserve_s)   # before each call of the loop
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths

log = logging.getLogger(__name__)
# Right after compiling, input and kernels are not at their steady pace: a warm-up call more, then a window to read it.
MEASURE_STEPS, MEASURE_S, WARMUP_CALLS = 50, 8.0, 2
MEASURE_SHARE = 0.05  # the measuring (compiling included) stops past this share of the budget
PACE_WINDOW_S = 60.0  # the re-plan's pace: the last minute of calls, checkpoints and validations inside it included


@dataclass(frozen=True)
class Budget:
    steps: int  # the step count planned at the start (train.steps caps it)
    seconds_per_step: float  # measured at the start
    seconds: float  # train.budget_minutes in seconds
    started_at: float | None  # time.time() when the measuring began (None: a run recorded before deadlines)


def budgeted_steps(
    run: RunPaths, minutes: float, cap: int | None, measure: Callable[[], tuple[float, float]]
) -> Budget:
    """The step count that fits the budget (`measure()`: seconds per step, seconds spent measuring), recorded in
    RunPaths.train_budget on the first try; a retry reads it back."""
    recorded = storage.read_json_if_exists(run.train_budget)
    if recorded:
        log.info(
            "Step count %d from the run's time budget (recorded %s: %.4f s/step, %g min): kept on this try",
            recorded["steps"],
            run.train_budget,
            recorded["seconds_per_step"],
            recorded["budget_minutes"],
        )
    else:
        started_at = time.time()
        step_s, spent_s = measure()
        steps = max(1, int((minutes * 60 - spent_s) / step_s))
        if cap is not None and steps > cap:
            log.info("%d steps would fit train.budget_minutes=%g, but train.steps caps them at %d", steps, minutes, cap)
            steps = cap
        recorded = {"steps": steps, "seconds_per_step": step_s, "measured_in_s": spent_s}
        recorded.update(budget_minutes=minutes, cap=cap, started_at=started_at)
        storage.write_json(run.train_budget, recorded)
        log.info(
            "Time budget %g min: %.4f s/step measured in %.1f s, so %d steps for a start; re-planned as it trains, "
            "it stops by %s (recorded in %s)",
            minutes,
            step_s,
            spent_s,
            steps,
            time.strftime("%H:%M:%S", time.localtime(started_at + minutes * 60)),
            run.train_budget,
        )
    seconds = float(recorded["budget_minutes"]) * 60
    return Budget(int(recorded["steps"]), float(recorded["seconds_per_step"]), seconds, recorded.get("started_at"))


def record_end(run: RunPaths, trained_steps: int, replans: int, used_s: float) -> dict[str, Any]:
    """Adds what the budget trained to budget.json (the steps, re-plans, seconds used against it); returns it."""
    record = dict(storage.read_json(run.train_budget))
    record.update(trained_steps=trained_steps, replans=replans, trained_s=used_s, ended_at=time.time())
    record["overrun_s"] = used_s - record["budget_minutes"] * 60
    storage.write_json(run.train_budget, record)
    return record


class Deadline:
    """The run's last step, re-planned before each call of the loop so the run ends by `deadline_at`: every step
    that fits before it less `reserve_s` (the end's checkpoint and validation) at the pace of the last
    PACE_WINDOW_S of calls (the start's measurement until two calls have run). train.steps (`cap`) caps it."""

    def __init__(
        self, deadline_at: float, seconds_per_step: float, cap: int | None, clock: Callable[[], float] = time.time
    ):
        self.deadline_at, self.cap, self.clock = deadline_at, cap, clock
        self.initial_pace = seconds_per_step
        self.calls: deque[tuple[float, int]] = deque()  # (time, step) after each call
        self.replans, self.first_call = 0, True

    def pace(self) -> float:
        """Seconds per step lately."""
        if len(self.calls) < 2:
            return self.initial_pace
        (t0, s0), (t1, s1) = self.calls[0], self.calls[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else self.initial_pace

    def total_before_call(self, step: int, per_call: int, total: int, reserve_s: float = 0.0) -> int:
        """The run's last step, decided before the call that starts after `step`."""
        now = self.clock()
        if self.first_call:  # what follows traces and compiles: the pace counts from its end
            self.first_call = False
        else:
            self.calls.append((now, step))
        while len(self.calls) > 2 and now - self.calls[1][0] >= PACE_WINDOW_S:
            self.calls.popleft()
        pace = self.pace()
        fits = int((self.deadline_at - reserve_s - now) / pace) if pace > 0 else per_call
        # When the call after this one would end past the deadline, this one is the last (a fresh run trains one).
        last_call = min(per_call, max(fits, 1 if step == 0 else 0))
        planned = step + (fits if fits >= 2 * per_call else last_call)
        if self.cap is not None:
            planned = min(planned, self.cap)
        if planned != total:
            self.replans += 1
        return planned


def seconds_per_step(
    strategy: Any, run_steps: Callable[[Any, int], Any], batches: Callable[[Any], Any], per_call: int, max_s: float
) -> tuple[float, float]:
    """(seconds per step, seconds spent) of `run_steps` (step_functions' call, of a throwaway model): WARMUP_CALLS
    calls (the first compiles), then calls of `per_call` steps until MEASURE_STEPS steps and MEASURE_S seconds have
    passed, or (one timed call at least) until `max_s` seconds have passed since the start, compiling included."""
    began = time.monotonic()
    iterator = iter(strategy.distribute_datasets_from_function(batches))
    cap_at = began + max_s
    for call in range(WARMUP_CALLS):  # the first traces and compiles; neither is timed
        if call and time.monotonic() >= cap_at:
            break
        run_steps(iterator, per_call).numpy()
    steps, timed = 0, time.monotonic()
    while steps < MEASURE_STEPS or time.monotonic() - timed < MEASURE_S:
        if steps and time.monotonic() >= cap_at:
            log.info(
                "Measuring stopped after %d steps at its cap, %.1f s (%.0f%% of the budget)",
                steps,
                max_s,
                100 * MEASURE_SHARE,
            )
            break
        run_steps(iterator, per_call).numpy()
        steps += per_call
    return (time.monotonic() - timed) / steps, time.monotonic() - began
