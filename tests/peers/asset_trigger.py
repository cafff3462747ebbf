"""Run an asset-triggered DAG run the way the scheduler would make it, then execute it like `dags test`.

`airflow dags test` always creates a *manual* run, and asset-triggered runs are made by the
scheduler, which `dags test` does not run. This harness closes that gap with Airflow's own code,
in a subprocess on the test's SQLite metadata DB:

  1. `DagModel.dags_needing_dagruns` — the scheduler's check of the asset-event queue (ADRQ): is the
     DAG due because of queued asset events?
  2. `SchedulerJobRunner._create_dag_runs_asset_triggered` — the scheduler's own creation of the
     ASSET_TRIGGERED run: it picks the asset events in the run's window, attaches them as
     `consumed_asset_events` and clears the queue;
  3. `DAG.test()` then executes *that* run (its run-creation helper is pointed at it), so every task
     gets `triggering_asset_events` from the metadata DB through the execution API, as on a worker.

    result = asset_triggered_test(env, "mlm_pretrain", mark_success_pattern="^(evaluate|report)$")
    result.stdout  -> task logs, then a last line "ASSET_TRIGGERED_RUN {json}" (run id, consumed event ids, oldest
    first)

If the DAG is not due (no queued event) the script exits 3 and says so: the test then knows that
the scheduler would not have started a run either.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from peers.airflow_home import ROOT

MARK = "ASSET_TRIGGERED_RUN "


def asset_triggered_test(
    env: dict[str, str],
    dag_id: str,
    *,
    mark_success_pattern: str | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    args = [sys.executable, str(Path(__file__).resolve()), dag_id]
    if mark_success_pattern:
        args += ["--mark-success-pattern", mark_success_pattern]
    env = {**env, **(extra_env or {}), "PYTHONPATH": env.get("PYTHONPATH", "") + f":{ROOT / 'tests'}"}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_info(result: subprocess.CompletedProcess) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith(MARK)]
    assert lines, (result.stdout + result.stderr)[-4000:]
    return json.loads(lines[-1][len(MARK) :])


def _create_run(dag_id: str):
    """Steps 1 and 2 above; returns the new DagRun's (id, run_id, consumed event ids)."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    with create_session() as session:
        query, triggered = DagModel.dags_needing_dagruns(session)
        due = [d for d in query.all() if d.dag_id == dag_id and d.dag_id in triggered]
        if not due:
            print(f"{dag_id} is not due: no queued asset event (the scheduler would start no run)", flush=True)
            sys.exit(3)
        before = set(session.scalars(select(DagRun.id).where(DagRun.dag_id == dag_id)))
        SchedulerJobRunner(Job())._create_dag_runs_asset_triggered(dag_models=due, session=session)
        session.flush()
        (run,) = [r for r in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)) if r.id not in before]
        assert run.run_type == DagRunType.ASSET_TRIGGERED, run.run_type
        events = sorted(run.consumed_asset_events, key=lambda e: (e.timestamp, e.id))
        return run.id, run.run_id, [e.id for e in events]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("dag_id")
    parser.add_argument("--mark-success-pattern")
    args = parser.parse_args(argv)

    from unittest import mock

    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import dagrun as dagrun_module
    from airflow.sdk import DagRunState
    from airflow.utils.state import DagRunState as CoreDagRunState

    bag = DagBag()  # the configured dags folder, as a worker parses it
    dag = bag.get_dag(args.dag_id)
    if dag is None:
        print(f"Cannot load {args.dag_id}: {bag.import_errors}", flush=True)
        return 2
    run_pk, run_id, event_ids = _create_run(args.dag_id)
    print(f"Created asset-triggered run {run_id} consuming asset events {event_ids}", flush=True)

    def existing_run(*, dag, session, **_):
        run = session.get(dagrun_module.DagRun, run_pk)
        run.dag = dag
        run.state = CoreDagRunState.RUNNING  # what the scheduler does when it starts a queued run
        session.commit()
        return run

    with mock.patch.object(dagrun_module, "get_or_create_dagrun", existing_run):
        run = dag.test(mark_success_pattern=args.mark_success_pattern)
    print(
        MARK
        + json.dumps(
            {
                "run_id": run_id,
                "state": str(run.state),
                "event_ids": event_ids,
                "success": run.state == DagRunState.SUCCESS,
            }
        ),
        flush=True,
    )
    return 0 if run.state == DagRunState.SUCCESS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
