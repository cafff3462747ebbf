"""Restarts inside one try of the train task (a node lost, a notice answered), in runs/<run>/train/restarts.json.

    restarts = record_restart(run, cause="the TPU VM ... is PREEMPTED", node=name, try_number=1, step=37)
    close_open(run, start_step=30)   # the next trainer, at its start: resumed_from, steps_lost
    read_restarts(run)   # [{"cause", "at_utc", "node", "try_number", "step", "resumed_from", "steps_lost"}, ...]

A file of its own, written while no trainer runs (one on a node being preempted may still rewrite its status).
"""

from __future__ import annotations

import time

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import Restart


def read_restarts(run: RunPaths) -> list[Restart]:
    """The run's node losses so far, in order ([] before the first)."""
    return list(storage.read_json_if_exists(run.train_restarts) or [])


def record_restart(run: RunPaths, *, cause: str, node: str, try_number: int, step: int) -> list[Restart]:
    """Appends a restart (the cause, the last step the lost trainer recorded) and returns them all."""
    restart: Restart = {
        "cause": cause,
        "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node": node,
        "try_number": try_number,
        "step": step,
        "resumed_from": None,
        "steps_lost": None,
    }
    restarts = [*read_restarts(run), restart]
    storage.write_json(run.train_restarts, restarts)
    return restarts


def close_open(run: RunPaths, start_step: int) -> list[Restart]:
    """A new trainer's start: the restart it answers (the last, still open) closed at its start step; all of
    them returned, for its status record."""
    restarts = read_restarts(run)
    if not restarts or restarts[-1]["resumed_from"] is not None:
        return restarts
    last = restarts[-1]
    closed: Restart = {**last, "resumed_from": start_step, "steps_lost": max(0, last["step"] - start_step)}
    storage.write_json(run.train_restarts, [*restarts[:-1], closed])
    return [*restarts[:-1], closed]


def summary_line(restarts: list[Restart]) -> str:
    """One line for a log or a report: how many, what they cost, why."""
    if not restarts:
        return "no restarts"
    lost = sum(r["steps_lost"] or 0 for r in restarts)
    causes = "; ".join(f"{r['at_utc']} at step {r['step']}: {r['cause']}" for r in restarts)
    return f"{len(restarts)} restart(s), {lost} step(s) retrained after them ({causes})"
