"""The `train` task: one task in the graph whichever compute the run uses.

`compute: local` trains in the worker process (the default strategy on CPU, Mirrored on GPUs);
`compute: tpu_vm` starts the same `python -m mlm_tasks train` as a detached job on worker 0 of the run's
TPU VM (`DetachedTrain`, below), then defers: the triggerer follows the trainer (`TrainJobTrigger`,
plugins/mlm_airflow/triggers/train_job.py) while the worker slot is free, and the task resumes in
`trainer_ended` when it is done, failed or stalled. The trainer outlives the task's process and the
triggerer's; a retry reattaches to it when it still runs; marking the task failed stops it (the
trigger's on_kill, or on_kill before the deferral). Either way a retry resumes from the run's last
checkpoint; on a TPU VM a retry first replaces a node that was preempted (create_tpu_vm, upstream, is
not rerun), waiting in the triggerer (`node_for_step`, plugins/mlm_airflow/operators/tpu_vm.py). The
task's execution_timeout comes from the run's config (`train.timeout_hours`, on a TPU VM at most
`tpu.ttl_hours`, which the validate task enforces), set before execute starts the clock.

`DetachedTrain` holds the RemoteStep (plugins/mlm_airflow/operators/remote_step.py: the node's checks,
the line, the session) and reads the job handle from the task state store (`context["task_state_store"]`,
key JOB_KEY). A handle whose trainer is alive and beating is reattached to (`reattach`,
mlm_tasks/training/follow.py): no second start, no lost step. A trainer that is gone (or a handle of a
node since replaced) is followed by a new start (mlm_tasks/tpu/job.py), which resumes from the last
checkpoint; one that is alive but stale is stopped first (its process group: SIGTERM, SIGCONT, then
SIGKILL). A new start runs the detached line of `remote_command` (the run lock, the install, then
setsid/nohup with the output in `<workdir>/logs/`) and stores the handle. The trigger's last verdict
becomes the task's end (`end_of_training`): done succeeds (with the log's last lines), failed fails with
the exit code and the last lines (exit 2 without retries), stalled (the watchdog) stops the trainer and
fails the try so that a retry starts a new one from the last checkpoint.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import hub_credentials, use_connection
from mlm_airflow.errors import bad_input_fails_fast
from mlm_airflow.operators.remote_step import RemoteStep
from mlm_airflow.operators.tpu_vm import node_for_step, node_from_event, run_node_name
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_airflow.triggers.train_job import TrainJobTrigger, connected_watch
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import NO_RETRY_EXIT
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import RemoteTrain, TrainJob, TrainSummary
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import job as vm_job
from mlm_tasks.tpu import ssh
from mlm_tasks.training.follow import JobWatch, Verdict, reattach
from mlm_tasks.training.status import read_status

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


def end_of_training(watch: JobWatch, verdict: Verdict) -> None:
    """The task's end for a final verdict: returns on done, raises otherwise (stopping a stalled trainer)."""
    job, log = watch.job, watch.log
    if verdict.kind == "done":
        log.info("Training done: %s.\n%s", verdict.detail, watch.tail_text())
        return
    if verdict.kind == "stalled":
        watch.stop()
        raise AirflowException(
            f"Watchdog: {verdict.detail}. The trainer was stopped; a retry starts a "
            "new one from the last checkpoint.\n" + watch.tail_text()
        )
    message = f"Training failed on TPU VM {job['node']}: {verdict.detail}.\n{watch.tail_text()}"
    if verdict.exit_code == NO_RETRY_EXIT:
        raise AirflowFailException(
            message + "\nExit code 2 is an error no retry can fix (a bad input, a "
            "missing artifact, a refused credential): act on the message above and "
            "trigger a new run."
        )
    raise AirflowException(message + "\nA retry starts a new trainer from the last checkpoint.")


class DetachedTrain:
    """The train step as a job on worker 0, through `remote`: `start` returns (job, workers) once the
    trainer runs, a new one or the stored one reattached to; see the module docstring."""

    def __init__(self, remote: RemoteStep) -> None:
        self.remote = remote
        self.log = remote.log
        self.watch: JobWatch | None = None

    def start(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> tuple[TrainJob, int]:
        name, hosts, connect = self.remote.connect_to(context, cfg, node)
        store = context.get("task_state_store")
        job = vm_job.job_handle(store.get(JOB_KEY) if store is not None else None)
        if job is not None and not reattach(watch_of(cfg, job, connect, self.log), node=name, host=hosts[0]):
            job = None
        if job is None:
            job = self._start(context, cfg, name, hosts[0], connect)
            if store is not None:
                # A handle is JSON (str, int and float fields); mypy sees no TypedDict as a dict[str, JsonValue].
                store.set(JOB_KEY, cast("JsonValue", dict(job)))
        self.watch = watch_of(cfg, job, connect, self.log)
        return job, len(hosts)

    def _start(self, context: Context, cfg: PipelineConfig, name: str, host: str, connect: ssh.Connect) -> TrainJob:
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
        before = read_status(RunPaths(cfg.output_root, context["run_id"]))  # the new trainer's record counts one more
        # The remote step's session: its close() (on_kill) hangs up a start still under way.
        self.remote.session = ssh.Session(connect, host, on_line=lambda line: self.log.info("[worker 0] %s", line))
        outcome, job = vm_job.start(
            self.remote.session,
            command,
            secret=self.remote.secret(),
            node=name,
            host=host,
            try_number=number,
            log=log_name,
            workdir=cfg.tpu.workdir,
            run_id=context["run_id"],
            now=time.time(),
            starts_before=before["starts"] if before else 0,
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


class TrainOperator(BaseOperator):
    """`config`: validate's return value; `data`: merge_shards' (both XComArgs, resolved at run time).
    `command` replaces the remote step line (tests); `node_name` the run's node name."""

    template_fields = ("config", "data", "command", "node_name")
    ui_color = "#fff2cc"

    def __init__(
        self, *, config: Any, data: Any, command: str | None = None, node_name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.data = data
        self.command = command
        self.node_name = node_name
        self.detached: DetachedTrain | None = None
        self.watch: JobWatch | None = None

    def pre_execute(self, context: Context) -> None:
        # Runs after the config template is rendered and before the task runner reads the timeout.
        from mlm_airflow.connections import install_for

        cfg = config_from_xcom(self.config)
        install_for(cfg)  # local training reads and writes gs:// with the run's connection
        hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
        self.execution_timeout = timedelta(hours=hours)
        self.log.info(
            "train execution_timeout: %g h (train.timeout_hours; tpu.ttl_hours is %g h).", hours, cfg.tpu.ttl_hours
        )

    def _fingerprint(self) -> str:
        if not isinstance(self.data, dict) or "fingerprint" not in self.data:
            raise AirflowFailException(
                f"No data fingerprint in merge_shards' result ({self.data!r}): check that task's log and return value."
            )
        return str(self.data["fingerprint"])

    def execute(self, context: Context) -> TrainSummary | RemoteTrain:
        cfg = config_from_xcom(self.config)
        fingerprint = self._fingerprint()
        if cfg.compute == "tpu_vm":
            with use_connection(cfg.gcp_conn_id):
                node = node_for_step(self, context, cfg, run_node_name(context, self.node_name), replace_in=self.resume)
                started = self._detached(cfg).start(context, cfg, node)
            self._follow(cfg, started)
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.train import train

        # Checkpoint sync: the connection's token goes to train as an argument, never into os.environ.
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id) if cfg.publish.sync_checkpoints else (None, None)
        with bad_input_fails_fast():
            return train(
                cfg, RunContext.of(cfg, context["run_id"], fingerprint), hub_token=token, hub_endpoint=endpoint
            )

    def resume(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> NoReturn:
        """After waiting for a replacement node the task resumes here, in a fresh operator instance."""
        cfg = config_from_xcom(self.config)
        node = node_from_event(self, context, cfg, event, resume_in=self.resume)
        with use_connection(cfg.gcp_conn_id):
            started = self._detached(cfg).start(context, cfg, tpu.get_state(cfg.tpu, node["name"]))
        self._follow(cfg, started)

    def _follow(self, cfg: PipelineConfig, started: tuple[TrainJob, int]) -> NoReturn:
        """Defer: wait for the trainer in the triggerer, until the task's execution_timeout (its backstop); the
        task resumes in trainer_ended."""
        job, workers = started
        hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
        self.log.info("Waiting for the trainer in the triggerer: this task holds no worker slot meanwhile.")
        trigger = TrainJobTrigger(
            output_root=cfg.output_root,
            job=job,
            workers=workers,
            tpu_config=cfg.tpu.model_dump(mode="json"),
            poll_s=cfg.train.follow_poll_s,
            stall_s=cfg.train.stall_minutes * 60,
            progress_s=cfg.train.progress_log_s,
            storage_timeout_s=cfg.storage.timeout_s,
            gcp_conn_id=cfg.gcp_conn_id,
        )
        self.defer(trigger=trigger, method_name="trainer_ended", timeout=timedelta(hours=hours))

    def trainer_ended(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> RemoteTrain:
        """Back from the trigger: the training's end as the task's (its log's last lines either way)."""
        cfg = config_from_xcom(self.config)
        event = event or {}
        job = vm_job.job_handle(event.get("job"))
        if job is None:
            raise AirflowException(
                f"The train trigger fired without a job ({event!r}): retry; the retry "
                "reattaches to the trainer if it still runs."
            )
        with use_connection(cfg.gcp_conn_id):
            self.watch = connected_watch(
                cfg.tpu, job, output_root=cfg.output_root, stall_s=cfg.train.stall_minutes * 60, log=self.log
            )
            end_of_training(self.watch, Verdict(event["kind"], event["detail"], event.get("exit_code")))
        return {"node": job["node"], "workers": event.get("workers", 1)}

    def _detached(self, cfg: PipelineConfig) -> DetachedTrain:
        """The step on the TPU VM. With checkpoint sync the Hub token travels on the SSH session's stdin
        (never in the command line, an environment, a log or XCom), its endpoint in the step's environment."""
        token, step_env = None, {}
        if cfg.publish.sync_checkpoints:
            token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
            if endpoint:
                step_env["HF_ENDPOINT"] = endpoint
        remote = RemoteStep(
            "train",
            self.log,
            args=["--data-fingerprint", self._fingerprint()],
            command=self.command,
            hub_token=token,
            step_env=step_env,
            replaces_dead_node=True,
        )
        self.detached = DetachedTrain(remote)
        return self.detached

    def on_kill(self) -> None:
        if self.detached is not None:
            self.detached.close()
        elif self.watch is not None:  # killed while reading the end: the trainer may still be stopping
            self.watch.stop()
