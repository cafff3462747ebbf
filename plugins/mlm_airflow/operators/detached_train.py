"""The train step started as a detached job on worker 0 of the run's TPU VM, for the train task, which decides
when (mlm_tasks/job/decide.py): `DetachedTrain(RemoteStep("train", log, ...)).start(context, cfg, node)`.
The handle goes to the task state store (JOB_KEY); the run lock stops a trainer an earlier start left.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, cast

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException

from mlm_airflow.operators.remote_step import RemoteStep
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job import launch as vm_job
from mlm_tasks.job.follow import JobWatch
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh

if TYPE_CHECKING:
    from pydantic import JsonValue  # what Airflow's task state store takes

JOB_KEY = "train_job"
ON_KILL_STOP_S = 4.0  # Airflow's supervisor SIGKILLs a task 5 s after asking it to stop


def try_number(context: Context) -> int:
    """The Airflow try running this code (1 outside Airflow)."""
    ti = context.get("ti")
    number = getattr(ti, "try_number", None) or os.environ.get("AIRFLOW_CTX_TRY_NUMBER", "")
    return int(number) if str(number).isdigit() else 1


class DetachedTrain:
    """The train step as a job on worker 0, through `remote`: `start` returns the new trainer's handle."""

    def __init__(self, remote: RemoteStep) -> None:
        self.remote = remote
        self.log = remote.log
        self.watch: JobWatch | None = None

    def start(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> TrainJob:
        name, hosts, connect = self.remote.connect_to(context, cfg, node)
        host, number = hosts[0], try_number(context)
        log_name = vm_job.log_name(context["run_id"], number)
        command = self.remote.command or self.remote.remote_line(
            context, cfg, name, detach_log=log_name, env={"MLM_TRY_NUMBER": str(number)}
        )
        self.log.info(
            "Starting the trainer detached on worker 0 of %s (try %d); its output goes to %s/%s.",
            name,
            number,
            cfg.tpu.workdir,
            log_name,
        )
        # The remote step's session: its close() (on_kill) hangs up a start still under way.
        self.remote.session = ssh.Session(connect, host, on_line=lambda line: self.log.info("[worker 0] %s", line))
        outcome, job = vm_job.start(
            self.remote.session,
            command,
            secret=self.remote.secret(),
            node=name,
            node_created=node.created,
            host=host,
            try_number=number,
            workdir=cfg.tpu.workdir,
            output_root=cfg.output_root,
            run_id=context["run_id"],
        )
        if outcome.exit_code != 0:
            raise self.remote.failure(cfg, name, outcome)
        if job is None:
            raise AirflowException(
                f"The detached start on {name} printed no job id ({outcome.describe()}): "
                "retry; if it repeats, run the line by hand on worker 0."
            )
        self.log.info("Trainer started: pid %d (its process group) on %s.", job["pid"], name)
        store = context.get("task_state_store")
        if store is not None:
            # A handle is JSON (str, int and float fields); mypy sees no TypedDict as a dict[str, JsonValue].
            store.set(JOB_KEY, cast("JsonValue", dict(job)))
        stall_s = cfg.train.stall_minutes * 60
        self.watch = JobWatch(
            vm_job.DetachedJob(job, connect), cfg.tpu, output_root=cfg.output_root, stall_s=stall_s, log=self.log
        )
        return job

    def close(self) -> None:
        """on_kill before the deferral: stop the trainer. In a thread, bounded: on_kill runs in a signal handler
        that may have interrupted an SSH call (and its locks); a stop not done in time leaves it to the teardown."""
        watch = self.watch
        if watch is not None:
            outcome: list[vm_job.Probe] = []
            stopper = threading.Thread(target=lambda: outcome.append(watch.stop()), daemon=True)
            stopper.start()
            stopper.join(ON_KILL_STOP_S)
            gone = bool(outcome) and outcome[0].alive is False
            self.log.info(
                "Task killed: the trainer is %s.",
                "gone"
                if gone
                else f"maybe still running (no confirmation within {ON_KILL_STOP_S:g}s; the teardown deletes the VM)",
            )
        self.remote.close()
