"""The `train` task: in the worker (`compute: local`), or as a detached trainer on worker 0 of the run's TPU
VM (`compute: tpu_vm`), followed by a trigger while the worker slot is free. Each visit carries out
mlm_tasks/job/decide.py's answer to the facts (docs/operations.md#durable-training-what-survives-what).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, NoReturn, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import hub_credentials, install_for, use_connection
from mlm_airflow.operators.remote_step import JOB_KEY, RemoteStep, try_number
from mlm_airflow.operators.tpu_vm import carry_out, node_facts, run_node_name
from mlm_airflow.tasks.step_context import bad_input_fails_fast, config_from_xcom
from mlm_airflow.triggers.train_job import TrainJobTrigger, connected_watch
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job import launch as vm_job
from mlm_tasks.job import restarts
from mlm_tasks.job.decide import Action, Facts, decide
from mlm_tasks.job.follow import JobWatch, Verdict
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import RemoteTrain, TrainJob, TrainSummary
from mlm_tasks.tpu import api as tpu

__all__ = ["JOB_KEY", "TrainOperator"]

# Task state store keys beside the job's handle (JOB_KEY): they hold across the task's processes and tries.
DEADLINE_KEY = "train_deadline"  # epoch seconds: the try sequence's first start + train.timeout_hours
RESTARTS_KEY = "train_restarts"
CHECK_INS_KEY = "train_check_ins"
DEFERRED_KEY = "train_deferred_to"  # which trigger a timeout belongs to: "trainer" or "node"
SEQUENCE_KEY = "train_first_try"  # the first try of the try sequence the keys above belong to


def run_deadline(context: Context, cfg: PipelineConfig) -> float:
    """When the training must end (epoch seconds), fixed at the try sequence's first start."""
    store = context.get("task_state_store")
    stored = store.get(DEADLINE_KEY) if store is not None else None
    if isinstance(stored, (int, float)):
        return float(stored)
    deadline = time.time() + cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours) * 3600
    if store is not None:
        store.set(DEADLINE_KEY, deadline)
    return deadline


class TrainOperator(BaseOperator):
    """`config`: validate's return value; `data`: merge_shards'. `command` replaces the remote step line (tests)."""

    template_fields = ("config", "data", "command")
    ui_color = "#fff2cc"

    def __init__(self, *, config: Any, data: Any, command: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.data = data
        self.command = command
        self.detached: RemoteStep | None = None
        self.watch: JobWatch | None = None

    def pre_execute(self, context: Context) -> None:
        # Runs after the config template is rendered and before the task runner reads the timeout.
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
            self._new_sequence(context)
            deadline = run_deadline(context, cfg)
            self.log.info(
                "The training's deadline: %s UTC (train.timeout_hours, from this try sequence's first start); a "
                "check-in every %g min (train.check_in_minutes), at most %d restarts after node losses "
                "(train.max_restarts).",
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(deadline)),
                cfg.train.check_in_minutes,
                cfg.train.max_restarts,
            )
            return self._drive(context, cfg)
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.train import train

        # Checkpoint sync: the connection's token goes to train as an argument, never into os.environ.
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id) if cfg.publish.sync_checkpoints else (None, None)
        with bad_input_fails_fast():
            return train(
                cfg, RunContext.of(cfg, context["run_id"], fingerprint), hub_token=token, hub_endpoint=endpoint
            )

    def _new_sequence(self, context: Context) -> None:
        """A Clear gets a fresh deadline and restart budget: clear_task_instances sets max_tries to the last try
        plus retries, so the sequence's first try (max_tries - retries + 1) moves; a retry keeps it."""
        store = context.get("task_state_store")
        max_tries = getattr(context.get("ti"), "max_tries", None)
        if store is None or not isinstance(max_tries, int):
            return
        first = max_tries - (self.retries or 0) + 1
        stored = store.get(SEQUENCE_KEY)
        if stored == first:
            return
        if stored is not None:
            self.log.info(
                "Try %d starts a new try sequence (a Clear, not a retry of tries %s+): a fresh deadline "
                "(train.timeout_hours) and restart budget (train.max_restarts).",
                try_number(context),
                stored,
            )
        for key in (DEADLINE_KEY, RESTARTS_KEY, CHECK_INS_KEY):
            store.delete(key)
        store.set(SEQUENCE_KEY, first)

    def resume(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> RemoteTrain:
        """Back from TpuNodeTrigger."""
        return self._drive(context, config_from_xcom(self.config), node_event=event)

    def trainer_ended(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> RemoteTrain:
        """Back from TrainJobTrigger, with its verdict (the node is asked again)."""
        event = event or {}
        job = vm_job.job_handle(event.get("job"))
        if job is None:
            raise AirflowException(
                f"The train trigger fired without a job ({event!r}): retry; the retry "
                "reattaches to the trainer if it still runs."
            )
        verdict = Verdict(event["kind"], event["detail"], event.get("exit_code"))
        return self._drive(context, config_from_xcom(self.config), verdict=(job, verdict))

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """The trainer's trigger timed out (train.check_in_minutes): a check-in that decides again in the same try,
        where Airflow's TaskDeferralTimeout would use up a retry. Every other resume is Airflow's."""
        error = (next_kwargs or {}).get("error")
        store = context.get("task_state_store")
        timed_out = next_method == TRIGGER_FAIL_REPR and error == TriggerFailureReason.TRIGGER_TIMEOUT
        if timed_out and store is not None and store.get(DEFERRED_KEY) == "trainer":
            checked_in = int(cast(int, store.get(CHECK_INS_KEY, 0))) + 1
            store.set(CHECK_INS_KEY, checked_in)
            self.log.info(
                "Check-in %d: the trainer's trigger reached train.check_in_minutes; this try goes on.", checked_in
            )
            return self._drive(context, config_from_xcom(self.config))
        return super().resume_execution(next_method, next_kwargs, context)

    def _drive(
        self,
        context: Context,
        cfg: PipelineConfig,
        *,
        node_event: dict[str, Any] | None = None,
        verdict: tuple[TrainJob, Verdict] | None = None,
    ) -> RemoteTrain:
        """Facts, decision, action, until an action defers, fails or ends the training."""
        name = run_node_name(context)
        store = context.get("task_state_store")
        rechecked, began = False, time.monotonic()
        while True:
            with use_connection(cfg.gcp_conn_id):
                node, facts = self._facts(context, cfg, name, node_event, verdict, rechecked)
            action = decide(facts)
            node_event, verdict = None, None
            if action.kind == "wait" and action.wait_for == "recheck":
                self.log.warning("%s in %gs (tpu.poll_interval_s).", action.why, cfg.tpu.poll_interval_s)
                time.sleep(cfg.tpu.poll_interval_s)
                rechecked = True
            elif action.kind in ("ensure_node", "wait") or (action.kind == "fail" and action.delete):
                if store is not None:
                    store.set(DEFERRED_KEY, "node")
                node_event = carry_out(
                    self, context, cfg, node, action, resume_in=self.resume, stockout_until=facts.stockout_until
                )
            elif action.kind == "restart":
                self._restart(context, cfg, facts, action.why)
            elif action.kind == "start":
                with use_connection(cfg.gcp_conn_id):
                    if facts.job is not None:
                        self.log.warning("%s.", action.why)
                    if action.stop and facts.job is not None:
                        self._watch(cfg, facts.job).stop()
                    job = self._detached(cfg).start(context, cfg, node)
                self._follow(context, cfg, job)
            elif action.kind == "reattach":
                assert facts.job is not None
                self.log.info(
                    "Reattached to the trainer of try %d (pid %d) in %.2fs: %s. No second trainer is started.",
                    *(facts.job["try_number"], facts.job["pid"], time.monotonic() - began, action.why),
                )
                self._follow(context, cfg, facts.job)
            elif action.kind == "done":
                with use_connection(cfg.gcp_conn_id):
                    self.log.info("Training done: %s.\n%s", action.why, self._tail(cfg, facts.job))
                return {"node": name, "workers": max(1, len(node.workers))}
            else:
                self._fail(context, cfg, facts, action)

    def _facts(
        self,
        context: Context,
        cfg: PipelineConfig,
        name: str,
        node_event: dict[str, Any] | None,
        ended: tuple[TrainJob, Verdict] | None,
        rechecked: bool,
    ) -> tuple[tpu.NodeState, Facts]:
        """What decide needs: the node, the stored trainer (or the one `ended`) and this try's budget."""
        store = context.get("task_state_store")
        job, verdict = ended or (vm_job.job_handle(store.get(JOB_KEY) if store is not None else None), None)
        return node_facts(
            cfg,
            context["run_id"],
            name,
            node_event,
            job=job,
            verdict=verdict,
            watch=lambda job: self._watch(cfg, job),
            deadline=run_deadline(context, cfg),
            rechecked=rechecked,
            try_number=try_number(context),
            restarts=int(cast(int, store.get(RESTARTS_KEY, 0))) if store is not None else 0,
        )

    def _follow(self, context: Context, cfg: PipelineConfig, job: TrainJob) -> NoReturn:
        """Defer to the trainer's trigger until the next check-in or the deadline, whichever is sooner."""
        left_s = run_deadline(context, cfg) - time.time()
        store = context.get("task_state_store")
        if store is not None:
            store.set(DEFERRED_KEY, "trainer")
        self.log.info("Waiting for the trainer in the triggerer: this task holds no worker slot meanwhile.")
        trigger = TrainJobTrigger(
            output_root=cfg.output_root,
            job=job,
            tpu_config=cfg.tpu.model_dump(mode="json"),
            poll_s=cfg.train.follow_poll_s,
            stall_s=cfg.train.stall_minutes * 60,
            progress_s=cfg.train.progress_log_s,
            storage_timeout_s=cfg.storage.timeout_s,
            gcp_conn_id=cfg.gcp_conn_id,
        )
        check_in_s = max(1.0, min(cfg.train.check_in_minutes * 60, left_s))
        self.defer(trigger=trigger, method_name="trainer_ended", timeout=timedelta(seconds=check_in_s))

    def _watch(self, cfg: PipelineConfig, job: TrainJob) -> JobWatch:
        return connected_watch(
            cfg.tpu, job, output_root=cfg.output_root, stall_s=cfg.train.stall_minutes * 60, log=self.log
        )

    def _tail(self, cfg: PipelineConfig, job: TrainJob | None) -> str:
        return self._watch(cfg, job).tail_text() if job is not None else ""

    def _restart(self, context: Context, cfg: PipelineConfig, facts: Facts, cause: str) -> None:
        """A restart inside this try: counted, recorded in restarts.json, the lost handle dropped."""
        store = context.get("task_state_store")
        if store is not None:
            store.delete(JOB_KEY)
            store.set(RESTARTS_KEY, facts.restarts + 1)
        run = RunPaths(cfg.output_root, context["run_id"])
        with use_connection(cfg.gcp_conn_id):
            status = read_status(run)
            recorded = restarts.record_restart(
                run,
                cause=cause,
                node=facts.job["node"] if facts.job is not None else "",
                try_number=try_number(context),
                step=status["step"] if status else 0,
            )
        self.log.warning(
            "Restart %d of at most %d (train.max_restarts), in try %d: %s. Last recorded step %d; replacing the "
            "node if it is lost and starting a new trainer from the last checkpoint.",
            *(facts.restarts + 1, cfg.train.max_restarts, try_number(context)),
            cause.rstrip("."),  # a trainer's own words end with one
            recorded[-1]["step"],
        )

    def _fail(self, context: Context, cfg: PipelineConfig, facts: Facts, action: Action) -> NoReturn:
        """The trainer stopped where asked, then the failure raised (AirflowFailException where no retry helps)."""
        message, job = action.why, facts.job
        store = context.get("task_state_store")
        if action.about == "budget" and store is not None:  # its trainer is gone with the node: a retry starts one
            store.delete(JOB_KEY)
        with use_connection(cfg.gcp_conn_id):
            if action.stop and job is not None and facts.node == "READY":
                self.watch = self._watch(cfg, job)
                self.watch.stop()
            if action.about == "trainer":
                message += "\n" + self._tail(cfg, job)
        if action.about == "deadline":
            hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
            message = (
                f"The training reached its deadline, train.timeout_hours={hours:g} from this try sequence's first "
                f"start ({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(facts.deadline))} UTC), and was stopped; its "
                f"checkpoints are kept under {RunPaths(cfg.output_root, context['run_id']).root}. Clear the task to "
                "go on from the last checkpoint with a new deadline, or raise train.timeout_hours (and "
                "tpu.ttl_hours) for a longer run."
            )
        message += f"\n{action.advice}" if action.advice else ""
        raise (AirflowException if action.retry else AirflowFailException)(message)

    def _detached(self, cfg: PipelineConfig) -> RemoteStep:
        """The step on the TPU VM; with checkpoint sync, the Hub token goes on the SSH session's stdin."""
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id) if cfg.publish.sync_checkpoints else (None, None)
        self.detached = RemoteStep(
            "train",
            self.log,
            args=["--data-fingerprint", self._fingerprint()],
            command=self.command,
            hub_token=token,
            step_env={"HF_ENDPOINT": endpoint} if endpoint else {},
            replaces_dead_node=True,
        )
        return self.detached

    def on_kill(self) -> None:
        if self.detached is not None:
            self.detached.close()
        elif self.watch is not None:  # killed while reading the end: the trainer may still be stopping
            self.watch.stop()
