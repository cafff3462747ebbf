"""Restarts inside one try of the train task: each node loss (a preemption, a deleted or failed node) the
task handles itself, by a new node and a new trainer from the last checkpoint, kept in the status record.

    restarts = record_restart(run, cause="the TPU VM ... is PREEMPTED", node=name, try_number=1)
    # ... the new trainer's StatusRecord fills the entry in: resumed_from (its start step), steps_lost
    status["restarts"]   # [{"cause", "at_utc", "node", "try_number", "step", "resumed_from", "steps_lost"}, ...]

Why here and not in Airflow's retries: a days-long run on Spot capacity is preempted many times, and each
Airflow retry is a budget meant for errors (`retries`); `train.max_restarts` is the budget for losses. The
record is written while no trainer runs (its node is gone), so nobody writes it at the same time.
"""

from __future__ import annotations

import time

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import Restart
from mlm_tasks.training.status import read_status, restarts_of


def record_restart(run: RunPaths, *, cause: str, node: str, try_number: int) -> list[Restart]:
    """Appends a restart to the run's status record (the step it reached, the cause) and returns them all."""
    status = read_status(run)
    restart: Restart = {
        "cause": cause,
        "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node": node,
        "try_number": try_number,
        "step": status["step"] if status else 0,
        "resumed_from": None,
        "steps_lost": None,
    }
    restarts = [*restarts_of(status), restart]
    if status is not None:
        storage.write_json(run.train_status, {**status, "restarts": restarts})
    return restarts


def summary_line(restarts: list[Restart]) -> str:
    """One line for a log or a report: how many, what they cost, why."""
    if not restarts:
        return "no restarts"
    lost = sum(r["steps_lost"] or 0 for r in restarts)
    causes = "; ".join(f"{r['at_utc']} at step {r['step']}: {r['cause']}" for r in restarts)
    return f"{len(restarts)} restart(s), {lost} step(s) retrained after them ({causes})"
