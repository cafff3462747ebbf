"""The `train` task: one task in the graph whichever compute the run uses.

`compute: local` trains in the worker process (the default strategy on CPU, Mirrored on GPUs);
`compute: tpu_vm` starts the same `python -m mlm_tasks train` as a detached job on worker 0 of the run's
TPU VM (`DetachedTrain`, plugins/mlm_airflow/operators/train_job.py), then defers: the triggerer follows the trainer
(`TrainJobTrigger`, plugins/mlm_airflow/triggers/train_job.py) while the worker slot is free, and the task resumes in
`trainer_ended` when it is done, failed or stalled. The trainer outlives the task's process and the
triggerer's; a retry reattaches to it when it still runs; marking the task failed stops it (the
trigger's on_kill, or on_kill before the deferral). Either way a retry resumes from the run's last checkpoint;
on a TPU VM a retry first replaces a node that was preempted (create_tpu_vm, upstream, is not
rerun), waiting in the triggerer (`node_for_step`, plugins/mlm_airflow/operators/tpu_vm.py). The task's
execution_timeout comes from the run's config (`train.timeout_hours`, on a TPU VM at most
`tpu.ttl_hours`, which the validate task enforces), set before execute starts the clock.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import hub_credentials, use_connection
from mlm_airflow.errors import bad_input_fails_fast
from mlm_airflow.operators.tpu_vm import node_for_step, node_from_event, run_node_name
from mlm_airflow.operators.train_job import DetachedTrain, JobWatch
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_airflow.triggers.train_job import TrainJobTrigger
from mlm_tasks.results import RemoteTrain, TrainJob, TrainSummary
from mlm_tasks.tpu import api as tpu


class TrainOperator(BaseOperator):
    """`config`: validate's return value; `data`: merge_shards' (both XComArgs, resolved at run time).
    `command` replaces the remote step line (tests); `node_name` the run's node name."""

    template_fields = ("config", "data", "command", "node_name")
    ui_color = "#fff2cc"

    def __init__(self, *, config: Any, data: Any, command: str | None = None, node_name: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.data = data
        self.command = command
        self.node_name = node_name
        self.remote: DetachedTrain | None = None
        self.watch: JobWatch | None = None

    def pre_execute(self, context: Any) -> None:
        # Runs after the config template is rendered and before the task runner reads the timeout.
        from mlm_airflow.connections import install_for

        cfg = config_from_xcom(self.config)
        install_for(cfg)  # local training reads and writes gs:// with the run's connection
        hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
        self.execution_timeout = timedelta(hours=hours)
        self.log.info("train execution_timeout: %g h (train.timeout_hours; tpu.ttl_hours is %g h).", hours,
                      cfg.tpu.ttl_hours)

    def _fingerprint(self) -> str:
        if not isinstance(self.data, dict) or "fingerprint" not in self.data:
            raise AirflowFailException(f"No data fingerprint in merge_shards' result ({self.data!r}): check that "
                                       "task's log and return value.")
        return self.data["fingerprint"]

    def execute(self, context: Any) -> TrainSummary | RemoteTrain:
        cfg = config_from_xcom(self.config)
        fingerprint = self._fingerprint()
        if cfg.compute == "tpu_vm":
            with use_connection(cfg.gcp_conn_id):
                node = node_for_step(self, context, cfg, run_node_name(context, self.node_name), replace_in=self.resume)
                return self._follow(cfg, self._remote(cfg).run(context, cfg, node))
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.train import train

        # Checkpoint sync: the connection's token goes to train as an argument, never into os.environ.
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id) if cfg.publish.sync_checkpoints else (None, None)
        with bad_input_fails_fast():
            return train(cfg, RunContext.of(cfg, context["run_id"], fingerprint), hub_token=token,
                         hub_endpoint=endpoint)

    def resume(self, context: Any, event: dict[str, Any] | None = None, **_: Any) -> Any:
        # After waiting for a replacement node the task resumes here, in a fresh operator instance.
        cfg = config_from_xcom(self.config)
        node = node_from_event(self, context, cfg, event, resume_in=self.resume)
        with use_connection(cfg.gcp_conn_id):
            return self._follow(cfg, self._remote(cfg).run(context, cfg, tpu.get_state(cfg.tpu, node["name"])))

    def _follow(self, cfg: Any, started: tuple[TrainJob, int]) -> Any:
        """Wait for the trainer in the triggerer, until the task's execution_timeout (its backstop)."""
        job, workers = started
        hours = cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours)
        self.log.info("Waiting for the trainer in the triggerer: this task holds no worker slot meanwhile.")
        self.defer(trigger=TrainJobTrigger(cfg.model_dump(mode="json"), dict(job), workers),
                   method_name="trainer_ended", timeout=timedelta(hours=hours))

    def trainer_ended(self, context: Any, event: dict[str, Any] | None = None, **_: Any) -> RemoteTrain:
        """Back from the trigger: the training's end as the task's (its log's last lines either way)."""
        from mlm_tasks.model.follow import Verdict

        cfg = config_from_xcom(self.config)
        event = event or {}
        if "job" not in event:
            raise AirflowException(f"The train trigger fired without a job ({event!r}): retry; the retry "
                                   "reattaches to the trainer if it still runs.")
        job = event["job"]
        with use_connection(cfg.gcp_conn_id):
            self.watch = JobWatch.connected(cfg, job, self.log)
            self.watch.ended(Verdict(event["kind"], event["detail"], event.get("exit_code")))
        return {"node": job["node"], "workers": event.get("workers", 1)}

    def _remote(self, cfg: Any) -> DetachedTrain:
        """The step on the TPU VM. With checkpoint sync the Hub token travels on the SSH session's stdin
        (never in the command line, an environment, a log or XCom), its endpoint in the step's environment."""
        token, step_env = None, {}
        if cfg.publish.sync_checkpoints:
            token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
            if endpoint:
                step_env["HF_ENDPOINT"] = endpoint
        self.remote = DetachedTrain("train", self.log, args=["--data-fingerprint", self._fingerprint()],
                                 command=self.command, hub_token=token,
                                 step_env=step_env, replaces_dead_node=True)
        return self.remote

    def on_kill(self) -> None:
        if self.remote is not None:
            self.remote.close()
        elif self.watch is not None:  # killed while reading the end: the trainer may still be stopping
            self.watch.stop()
