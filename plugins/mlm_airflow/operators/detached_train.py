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


def watch_of(cfg: PipelineConfig, job: TrainJob, connect: ssh.Connect, log: vm_job.Log) -> JobWatch:
    return JobWatch(
        vm_job.DetachedJob(job, connect),
        cfg.tpu,
        output_root=cfg.output_root,
        stall_s=cfg.train.stall_minutes * 60,
        log=log,
    )


class DetachedTrain:
    """The train step as a job on worker 0, through `remote`: `start` returns the new trainer's handle."""

    def __init__(self, remote: RemoteStep) -> None:
        self.remote = remote
        self.log = remote.log
        self.watch: JobWatch | None = None

    def start(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> TrainJob:
        name, hosts, connect = self.remote.connect_to(context, cfg, node)
        job = self._start(context, cfg, name, hosts[0], connect, node.created)
        store = context.get("task_state_store")
        if store is not None:
            # A handle is JSON (str, int and float fields); mypy sees no TypedDict as a dict[str, JsonValue].
            store.set(JOB_KEY, cast("JsonValue", dict(job)))
        self.watch = watch_of(cfg, job, connect, self.log)
        return job

    def _start(
        self, context: Context, cfg: PipelineConfig, name: str, host: str, connect: ssh.Connect, created: float | None
    ) -> TrainJob:
        number = try_number(context)
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
            node_created=created,
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
        return job

    def close(self) -> None:
        """on_kill before the deferral: stop the trainer (the task was marked failed, cleared or timed out).
        In a thread, bounded: on_kill runs in a signal handler, which may have interrupted this very process
        inside an SSH call (and its locks); Airflow SIGKILLs the task a few seconds later anyway. A stop
        that does not finish in time leaves the trainer to the teardown, which deletes the VM."""
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
