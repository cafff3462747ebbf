"""A step operator for tests: `python -m mlm_tasks <step>` (or `command`) on worker 0 of the run's TPU VM,
attached to its SSH session, through the same RemoteStep the train task composes.

    step = TpuSSHStepOperator(task_id="train", config=cfg, command="echo hi")   # {"node", "workers"}

No DAG of the project runs a step this way (train runs detached, plugins/mlm_airflow/operators/train.py);
the tests use it to drive RemoteStep, the SSH login and the node checks as a task does, in a test DAG
under `airflow dags test` too (tests/ on its PYTHONPATH). With `replace_dead_node` a dead node is
replaced first, waiting in the triggerer, as the train task does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from mlm_airflow.connections import use_connection
from mlm_airflow.operators.remote_step import RemoteStep
from mlm_airflow.operators.tpu_vm import drive_node, run_node_name
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_tasks.tpu import api as tpu


class TpuSSHStepOperator(BaseOperator):
    """Run `python -m mlm_tasks <step>` (or `command`) on the run's TPU VM (worker 0 of a pod slice)."""

    template_fields = ("config", "step", "step_args", "command")
    ui_color = "#e8f7d7"

    def __init__(
        self,
        *,
        config: Any,
        step: str = "train",
        step_args: Sequence[str] = (),
        command: str | None = None,
        replace_dead_node: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.step = step
        self.step_args = list(step_args)
        self.command = command
        self.replace_dead_node = replace_dead_node
        self.remote: RemoteStep | None = None

    def _remote(self) -> RemoteStep:
        # Built at run time: the templated fields are rendered by then.
        self.remote = RemoteStep(
            self.step, self.log, args=self.step_args, command=self.command, replaces_dead_node=self.replace_dead_node
        )
        return self.remote

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        if cfg.compute != "tpu_vm":
            raise AirflowSkipException(f"compute is {cfg.compute!r}: the step runs locally, not here.")
        name = run_node_name(context)
        if self.replace_dead_node:  # as create_tpu_vm does it (the driver's decisions)
            drive_node(self, context, cfg, name, resume_in=self.resume)
        with use_connection(cfg.gcp_conn_id):
            node = tpu.get_state(cfg.tpu, name)
            if not node.ready:
                raise AirflowException(f"TPU VM {name} is {node.state}, not READY: clear create_tpu_vm and this task.")
            return self._remote().run(context, cfg, node)

    def resume(self, context: Any, event: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        """Back from the wait for a replacement node."""
        cfg = config_from_xcom(self.config)
        node = drive_node(self, context, cfg, run_node_name(context), resume_in=self.resume, event=event)
        with use_connection(cfg.gcp_conn_id):
            return self._remote().run(context, cfg, tpu.get_state(cfg.tpu, node["name"]))

    def on_kill(self) -> None:
        if self.remote is not None:
            self.remote.close()
