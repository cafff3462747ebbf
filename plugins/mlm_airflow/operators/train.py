"""The `train` task: one task in the graph whichever compute the run uses.

`compute: local` trains in the worker process (the default strategy on CPU, Mirrored on GPUs);
`compute: tpu_vm` starts the same `python -m mlm_tasks train` as a detached job on worker 0 of the run's
TPU VM (`DetachedTrain`), then defers: the triggerer follows the trainer (`TrainJobTrigger`,
plugins/mlm_airflow/triggers/train_job.py) while the worker slot is free, and the task resumes in
`trainer_ended` when it is done, failed or stalled. The trainer outlives the task's process and the
triggerer's; a retry reattaches to it when it still runs; marking the task failed stops it (the
trigger's on_kill, or on_kill before the deferral). Either way a retry resumes from the run's last
checkpoint; on a TPU VM a retry first replaces a node that was preempted (create_tpu_vm, upstream, is
not rerun), waiting in the triggerer (`node_for_step`, plugins/mlm_airflow/operators/tpu_vm.py).

Inside one try (issue 31): a lost node (the trigger's "lost": preempted, deleted; or found replaced under
the stored trainer) is a restart, not a failure: a new node and a new trainer from the last checkpoint
(`_restart`, at most train.max_restarts, each in runs/<run>/train/restarts.json:
mlm_tasks/training/restarts.py). The trigger's timeout, train.check_in_minutes, is a check-in
(`resume_execution`): the deadline, one check, then the deferral again. The deadline, train.timeout_hours
from the task's first start, is kept in the task state store with the counts, so no retry moves it; past
it the trainer is stopped and the task fails without retry. The execution_timeout
(the same hours, set before execute starts the clock) bounds each visit of the task to a worker.

The start, the reattach and the end of a detached trainer: `DetachedTrain` and `end_of_training`
(plugins/mlm_airflow/operators/detached_train.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any, NoReturn, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import hub_credentials, use_connection
from mlm_airflow.errors import bad_input_fails_fast
from mlm_airflow.operators.detached_train import JOB_KEY, DetachedTrain, end_of_training, try_number
from mlm_airflow.operators.remote_step import RemoteStep
from mlm_airflow.operators.tpu_vm import node_for_step, node_from_event, run_node_name
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_airflow.triggers.train_job import ENDS, TrainJobTrigger, connected_watch
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import RemoteTrain, TrainJob, TrainSummary
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import job as vm_job
from mlm_tasks.training import restarts
from mlm_tasks.training.follow import JobWatch, NodeLost, Verdict
from mlm_tasks.training.status import read_status

__all__ = ["JOB_KEY", "TrainOperator"]

# In the task state store with the job's handle (JOB_KEY), so that they hold across the task's processes and tries:
DEADLINE_KEY = "train_deadline"  # epoch seconds: the task's first start + train.timeout_hours
RESTARTS_KEY = "train_restarts"  # node losses handled so far (train.max_restarts)
CHECK_INS_KEY = "train_check_ins"  # trigger timeouts turned into check-ins
DEFERRED_KEY = "train_deferred_to"  # which trigger a timeout belongs to: {"trigger": "trainer"|"node", "workers"}


def run_deadline(context: Context, cfg: PipelineConfig) -> float:
    """When the training must end (epoch seconds): fixed at the task's first start, kept in its state store
    (without one, from now)."""
    store = context.get("task_state_store")
    stored = store.get(DEADLINE_KEY) if store is not None else None
    if isinstance(stored, (int, float)):
        return float(stored)
    deadline = time.time() + cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours) * 3600
    if store is not None:
        store.set(DEADLINE_KEY, deadline)
    return deadline


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
            deadline = run_deadline(context, cfg)
            self.log.info(
                "The training's deadline: %s UTC (train.timeout_hours, from this task's first start); a check-in "
                "every %g min (train.check_in_minutes), at most %d restarts after node losses (train.max_restarts).",
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(deadline)),
                cfg.train.check_in_minutes,
                cfg.train.max_restarts,
            )
            self._start_and_follow(context, cfg)
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
            ready = tpu.get_state(cfg.tpu, node["name"])
        self._start_on(context, cfg, ready)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """The trainer's trigger timed out (train.check_in_minutes): a check-in, not a failure. Airflow turns a
        trigger timeout into TaskDeferralTimeout, an ordinary failure that would use up a retry every
        check-in; here the task checks the deadline, reattaches to the trainer and defers again, in the same
        try. Every other resume (a node trigger's timeout included) is Airflow's."""
        error = (next_kwargs or {}).get("error")
        store = context.get("task_state_store")
        timed_out = next_method == TRIGGER_FAIL_REPR and error == TriggerFailureReason.TRIGGER_TIMEOUT
        deferred = store.get(DEFERRED_KEY) if store is not None else None
        if timed_out and store is not None and isinstance(deferred, dict) and deferred.get("trigger") == "trainer":
            return self._check_in(context, store, deferred)
        return super().resume_execution(next_method, next_kwargs, context)

    def _check_in(self, context: Context, store: Any, deferred: dict[str, Any]) -> RemoteTrain:
        """At the trainer's trigger timeout: the deadline, then one check of the stored trainer. An end (a lost
        node among them) is handled as the trigger's event would be; a running trainer is followed on."""
        cfg = config_from_xcom(self.config)
        checked_in = int(store.get(CHECK_INS_KEY, 0)) + 1
        store.set(CHECK_INS_KEY, checked_in)
        self.log.info(
            "Check-in %d: the trainer's trigger reached train.check_in_minutes=%g; this try goes on.",
            checked_in,
            cfg.train.check_in_minutes,
        )
        self._check_deadline(context, cfg)
        job = vm_job.job_handle(store.get(JOB_KEY))
        if job is not None:
            with use_connection(cfg.gcp_conn_id):
                verdict = self._watch(cfg, job).check()
            if verdict.kind in ENDS:
                return self.trainer_ended(
                    context, {**asdict(verdict), "job": job, "workers": deferred.get("workers", 1)}
                )
        self._start_and_follow(context, cfg)

    def _start_and_follow(self, context: Context, cfg: PipelineConfig) -> NoReturn:
        """The run's node READY (a dead one replaced, waiting in the triggerer), the trainer on it started or
        reattached to, then the deferral that follows it."""
        self._check_deadline(context, cfg)
        store = context.get("task_state_store")
        if store is not None:
            store.set(DEFERRED_KEY, {"trigger": "node"})
        with use_connection(cfg.gcp_conn_id):
            node = node_for_step(self, context, cfg, run_node_name(context, self.node_name), replace_in=self.resume)
        self._start_on(context, cfg, node)

    def _start_on(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> NoReturn:
        """The trainer on this READY node, the stored one reattached to or a new one, then followed. A stored
        one whose node was lost (preempted since it was READY) or replaced (by this task's check-in, or a cleared
        create_tpu_vm) is a restart, counted and recorded, not a start that would leave its loss uncounted."""
        lost = None
        with use_connection(cfg.gcp_conn_id):
            try:
                started = self._detached(cfg).start(context, cfg, node)
            except NodeLost as err:
                lost = str(err)
        if lost is not None:
            store = context.get("task_state_store")
            job = cast(TrainJob, vm_job.job_handle(store.get(JOB_KEY) if store is not None else None))
            self._restart(context, cfg, job, lost)
        self._follow(context, cfg, started)

    def _check_deadline(self, context: Context, cfg: PipelineConfig) -> None:
        """Past the deadline: the stored trainer is stopped and the task fails, without retry."""
        deadline = run_deadline(context, cfg)
        if time.time() < deadline:
            return
        store = context.get("task_state_store")
        job = vm_job.job_handle(store.get(JOB_KEY) if store is not None else None)
        if job is not None:
            with use_connection(cfg.gcp_conn_id):
                self._watch(cfg, job).stop()
        hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
        raise AirflowFailException(
            f"The training reached its deadline, train.timeout_hours={hours:g} from this task's first start "
            f"({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(deadline))} UTC), and was stopped; its checkpoints "
            f"are kept under {RunPaths(cfg.output_root, context['run_id']).root}. Raise train.timeout_hours (and "
            "tpu.ttl_hours) for a longer run."
        )

    def _follow(self, context: Context, cfg: PipelineConfig, started: tuple[TrainJob, int]) -> NoReturn:
        """Defer: wait for the trainer in the triggerer until the next check-in (or the deadline, if sooner);
        the task resumes in trainer_ended, or in resume_execution at the trigger's timeout."""
        job, workers = started
        left_s = run_deadline(context, cfg) - time.time()
        store = context.get("task_state_store")
        if store is not None:
            store.set(DEFERRED_KEY, {"trigger": "trainer", "workers": workers})
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
        check_in_s = max(1.0, min(cfg.train.check_in_minutes * 60, left_s))
        self.defer(trigger=trigger, method_name="trainer_ended", timeout=timedelta(seconds=check_in_s))

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
        if event["kind"] == "lost":
            self._restart(context, cfg, job, event["detail"])
        with use_connection(cfg.gcp_conn_id):
            self.watch = self._watch(cfg, job)
            end_of_training(self.watch, Verdict(event["kind"], event["detail"], event.get("exit_code")))
        return {"node": job["node"], "workers": event.get("workers", 1)}

    def _watch(self, cfg: PipelineConfig, job: TrainJob) -> JobWatch:
        """The stored trainer, checked or stopped from this task (within a use_connection block)."""
        return connected_watch(
            cfg.tpu, job, output_root=cfg.output_root, stall_s=cfg.train.stall_minutes * 60, log=self.log
        )

    def _restart(self, context: Context, cfg: PipelineConfig, job: TrainJob, cause: str) -> NoReturn:
        """The trainer's node is gone: inside this try, a new node and a new trainer from the last checkpoint,
        while train.max_restarts lasts (counted for the task, across its tries)."""
        store = context.get("task_state_store")
        used = int(cast(int, store.get(RESTARTS_KEY, 0))) if store is not None else 0
        run = RunPaths(cfg.output_root, context["run_id"])
        if store is not None:  # its trainer is gone with the node: what follows (or a retry) starts one, once
            store.delete(JOB_KEY)
        if used >= cfg.train.max_restarts:
            so_far = restarts.summary_line(restarts.read_restarts(run))
            raise AirflowException(
                f"Training lost its node again ({cause}) after train.max_restarts={cfg.train.max_restarts} restarts "
                f"({so_far}). This try fails; an Airflow retry starts a new trainer from the last checkpoint. Raise "
                "train.max_restarts for capacity that is preempted this often."
            )
        if store is not None:
            store.set(RESTARTS_KEY, used + 1)
        status = read_status(run)
        recorded = restarts.record_restart(
            run, cause=cause, node=job["node"], try_number=try_number(context), step=status["step"] if status else 0
        )
        self.log.warning(
            "Restart %d of at most %d (train.max_restarts), in try %d: %s. Last recorded step %d; replacing the "
            "node and starting a new trainer from the last checkpoint.",
            used + 1,
            cfg.train.max_restarts,
            try_number(context),
            cause,
            recorded[-1]["step"],
        )
        self._start_and_follow(context, cfg)

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
