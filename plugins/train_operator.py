"""The `train` task: one task in the graph whichever compute the run uses.

`compute: local` trains in the worker process (the default strategy on CPU, Mirrored on GPUs);
`compute: tpu_vm` runs the same `python -m mlm_tasks train` on every worker of the run's TPU VM
over SSH (TpuSSHStepOperator). Either way a retry resumes from the run's last checkpoint.
"""
from __future__ import annotations

from typing import Any

from airflow.exceptions import AirflowFailException

from mlm_tasks.config import ConfigError
from remote_step import TpuSSHStepOperator
from tpu_operators import resolve_config


class TrainOperator(TpuSSHStepOperator):
    ui_color = "#fff2cc"

    def __init__(self, *, data_task_id: str = "prepare_data", **kwargs: Any) -> None:
        super().__init__(step="train", **kwargs)
        self.data_task_id = data_task_id

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = resolve_config(self.config)
        data = context["ti"].xcom_pull(task_ids=self.data_task_id)
        if not data or "fingerprint" not in data:
            raise AirflowFailException(f"No data fingerprint from {self.data_task_id!r}: check that task's output.")
        if cfg.compute == "tpu_vm":
            self.step_args = ["--data-fingerprint", data["fingerprint"]]
            return super().execute(context)
        from mlm_tasks.train import train

        try:
            return train(cfg, context["run_id"], data["fingerprint"])
        except ConfigError as err:
            raise AirflowFailException(str(err)) from None
