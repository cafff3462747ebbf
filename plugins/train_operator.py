"""The `train` task: one task in the graph whichever compute the run uses.

`compute: local` trains in the worker process (the default strategy on CPU, Mirrored on GPUs);
`compute: tpu_vm` runs the same `python -m mlm_tasks train` on the run's TPU VM over SSH
(TpuSSHStepOperator; worker 0 of a pod slice). Either way a retry resumes from the run's last checkpoint; on a TPU
VM a retry first replaces a node that was preempted (create_tpu_vm, a setup task, is not rerun).
The task's execution_timeout comes from the run's config (`train.timeout_hours`, on a TPU VM at
most `tpu.ttl_hours`, which the validate task enforces), set before execute starts the clock.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from hub_connection import hub_credentials
from remote_step import TpuSSHStepOperator
from step_context import config_from_xcom
from task_errors import bad_input_fails_fast


class TrainOperator(TpuSSHStepOperator):
    """`config`: validate's return value; `data`: merge_shards' (both XComArgs, resolved at run time)."""

    template_fields = (*TpuSSHStepOperator.template_fields, "data")
    ui_color = "#fff2cc"

    def __init__(self, *, data: Any, **kwargs: Any) -> None:
        kwargs.setdefault("replace_dead_node", True)
        super().__init__(step="train", **kwargs)
        self.data = data

    def pre_execute(self, context: Any) -> None:
        # Runs after the config template is rendered and before the task runner reads the timeout.
        from gcp_credentials import install_for

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

    def remote_args(self, context: Any) -> list[str]:
        # Computed here, not in execute: after waiting for a replacement node the task resumes
        # in a fresh operator instance, straight into the step.
        return [*self.step_args, "--data-fingerprint", self._fingerprint()]

    def session_env(self, cfg: Any) -> dict[str, str]:
        """On a TPU VM, checkpoint sync gets the Hub token through the SSH session's environment:
        never in the command line, a log or XCom."""
        if not cfg.publish.sync_checkpoints:
            return {}
        from mlm_tasks.tpu.bundle import SESSION_ENV_TOKEN

        return {SESSION_ENV_TOKEN: hub_credentials(cfg.publish.hf_conn_id)[0]}

    def step_env(self, cfg: Any) -> dict[str, str]:
        if not cfg.publish.sync_checkpoints:
            return {}
        endpoint = hub_credentials(cfg.publish.hf_conn_id)[1]
        return {"HF_ENDPOINT": endpoint} if endpoint else {}

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        fingerprint = self._fingerprint()
        if cfg.compute == "tpu_vm":
            return super().execute(context)
        from mlm_tasks.paths import RunContext
        from mlm_tasks.steps.train import train

        # Checkpoint sync: the connection's token goes to train as an argument, never into os.environ.
        token, endpoint = hub_credentials(cfg.publish.hf_conn_id) if cfg.publish.sync_checkpoints else (None, None)
        with bad_input_fails_fast():
            return train(cfg, RunContext.of(cfg, context["run_id"], fingerprint), hub_token=token,
                         hub_endpoint=endpoint)
