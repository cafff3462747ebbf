"""Airflow operators that make and remove the run's TPU VM (both skip unless `compute` is "tpu_vm"), and the
node's part of the trainer's driver: `drive_node` and `carry_out` carry out mlm_tasks/job/decide.py's answer.

    create = TpuVmCreateOperator(task_id="create_tpu_vm", config=config)
    [create, train] >> TpuVmDeleteOperator(task_id="delete_tpu_vm", config=config).as_teardown()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from mlm_airflow.connections import use_connection
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_airflow.triggers.tpu_vm import TpuNodeTrigger
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job.decide import Action, Facts, decide, gather
from mlm_tasks.job.launch import Log
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import registry as tpu_registry
from mlm_tasks.tpu.calls import capacity


def run_node_name(context: Context) -> str:
    return tpu.node_name(context["dag"].dag_id, context["run_id"])


def ssh_key_metadata(conn_id: str, log: Log) -> dict[str, str]:
    """`ssh-keys` metadata for the node: the public half of the SSH connection's key (ignored under OS Login)."""
    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook = SSHHook(ssh_conn_id=conn_id, remote_host="unused")
    except AirflowNotFoundException:
        log.warning(
            "No Airflow connection %r: the VM gets no ssh-keys metadata; add it so the SSH step can log in.", conn_id
        )
        return {}
    key = hook.pkey or (paramiko.PKey.from_path(hook.key_file) if hook.key_file else None)
    if key is None or not hook.username:
        return {}
    return {"ssh-keys": f"{hook.username}:{key.get_name()} {key.get_base64()} {hook.username}"}


def node_facts(
    cfg: PipelineConfig, run_id: str, name: str, event: dict[str, Any] | None = None, **trainer: Any
) -> tuple[tpu.NodeState, Facts]:
    """The node now, or as TpuNodeTrigger's event ended, and decide's facts (`trainer`: gather's, for train)."""
    event = event or {}
    if event.get("state") not in (None, "READY") or event.get("error"):
        node = tpu.NodeState(name=name, state=event["state"])
    else:
        node = tpu.get_state(cfg.tpu, name)
    facts = gather(
        cfg, run_id, node, node_error=event.get("error"), stockout_until=event.get("stockout_until"), **trainer
    )
    return node, facts


def drive_node(
    op: BaseOperator, context: Context, cfg: PipelineConfig, name: str, *, resume_in: Callable[..., Any], event=None
) -> dict[str, Any]:
    """The run's node READY (`tpu.describe` of it), as `decide` says; until then `op` defers to TpuNodeTrigger
    and resumes in `resume_in`, a method of `op` that hands the event back here."""
    while True:
        with use_connection(cfg.gcp_conn_id):
            node, facts = node_facts(cfg, context["run_id"], name, event)
        action = decide(facts)
        if action.kind in ("start", "reattach", "done"):  # READY: what comes next is the caller's
            return tpu.describe(node)
        event = carry_out(op, context, cfg, node, action, resume_in=resume_in, stockout_until=facts.stockout_until)


def carry_out(
    op: BaseOperator,
    context: Context,
    cfg: PipelineConfig,
    node: tpu.NodeState,
    action: Action,
    *,
    resume_in: Callable[..., Any],
    stockout_until: float | None = None,
) -> dict[str, Any] | None:
    """The node's part of a decision: ensure_node, wait (for the node, or for capacity), a failed create. What
    ensure_node returns is the node event for the next facts: the create's error, or None (READY)."""
    name = node.name
    if action.kind == "ensure_node":
        op.log.info("TPU VM %s: %s.", name, action.why)
        made = ensure_ready(op, context, cfg, name, resume_in=resume_in, stockout_until=stockout_until)
        return {"state": made.state, "error": made.error} if made.error else None
    if action.kind == "wait" and action.wait_for == "capacity":  # what the create left deleted, then created again
        operation = delete_left(cfg, name)
        retry_at = time.time() + cfg.tpu.stockout_retry_s
        op.log.warning(
            "No capacity for %s in %s (%s): creating TPU VM %s again at %s UTC, until %s UTC "
            "(tpu.stockout_wait_hours), in this try. To get a node sooner: another tpu.zone, or queued.",
            *(cfg.tpu.accelerator_type, cfg.tpu.zone, action.why, name),
            *(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t in (retry_at, action.until or retry_at)),
        )
        wait_s = cfg.tpu.stockout_retry_s + cfg.tpu.create_timeout_s  # for the node to be gone, then the next create
        defer_to_node(
            op,
            cfg,
            name,
            wait_s,
            operation,
            resume_in,
            until_gone=True,
            not_before=retry_at,
            stockout_until=action.until,
        )
    if action.kind == "wait":
        defer_to_node(op, cfg, name, cfg.tpu.create_wait_s(), None, resume_in, stockout_until=stockout_until)
    if action.kind == "fail" and action.delete:
        failed_create(op, context, cfg, node, action)
    raise ValueError(f"not a node action: {action}")


def ensure_ready(
    op: BaseOperator,
    context: Context,
    cfg: PipelineConfig,
    name: str,
    *,
    resume_in: Callable[..., Any],
    stockout_until: float | None = None,
) -> tpu.NodeState:
    """`tpu.ensure_node` after recording the node in the registry; the node when READY or refused (its error),
    else a deferral to TpuNodeTrigger until it settles."""
    metadata = ssh_key_metadata(cfg.tpu.ssh_conn_id, op.log)
    node_labels = tpu.labels(context["run_id"], cfg.tpu.ttl_hours)
    registry = tpu_registry.location()  # unset: fail before anything is made that nobody would find
    with use_connection(cfg.gcp_conn_id):
        # First: a node that exists is always one the janitor knows about.
        tpu_registry.record(registry, cfg.tpu.project, cfg.tpu.zone, name, node_labels["expires"])
        state = tpu.ensure_node(cfg.tpu, name, node_labels, metadata)
        op.log.info("TPU VM %s: %s (%s).", name, state.state, state.action)
    if state.ready or state.error:
        return state
    operation = state.operation if state.action == "created" else None
    defer_to_node(op, cfg, name, cfg.tpu.create_wait_s(), operation, resume_in, stockout_until=stockout_until)


def defer_to_node(
    op: BaseOperator,
    cfg: PipelineConfig,
    name: str,
    wait_s: float,
    operation: str | None,
    resume_in: Callable[..., Any],
    **trigger_args: Any,
) -> NoReturn:
    """Defer `op` to TpuNodeTrigger for node `name` for at most `wait_s`, resuming in `resume_in`. The trigger
    enforces that deadline itself (so the task can clean up); Airflow's timeout is only a backstop."""
    trigger = TpuNodeTrigger(
        cfg.tpu.model_dump(mode="json"),
        name,
        time.time() + wait_s,  # the deadline
        operation,
        cfg.tpu.poll_interval_s,
        gcp_conn_id=cfg.gcp_conn_id,
        **trigger_args,
    )
    op.defer(trigger=trigger, method_name=resume_in.__name__, timeout=timedelta(seconds=wait_s + 600))


def failed_create(
    op: BaseOperator, context: Context, cfg: PipelineConfig, node: tpu.NodeState, action: Action
) -> NoReturn:
    """A create that gave no READY node: what it left is deleted, then the task fails naming what to try."""
    name, error = node.name, action.why
    deleted = None
    if node.state != tpu.NOT_FOUND or cfg.tpu.provisioning == "queued":  # a FAILED request has no node, and is left
        deleted = delete_left(cfg, name)
    cleanup = "deleted it" if deleted else "nothing left to delete"
    if not action.retry:
        raise AirflowFailException(f"{error} TPU VM {name}: {cleanup}.")
    if node.state == "TIMEOUT":
        queued = f"tpu.queued_valid_hours={cfg.tpu.queued_valid_hours:g} + " if cfg.tpu.provisioning == "queued" else ""
        raise AirflowException(
            f"TPU VM {name} was not READY within {queued}tpu.create_timeout_s={cfg.tpu.create_timeout_s}s "
            f"({error}); {cleanup}. Retry later, raise the timeout, or pick another tpu.zone."
        )
    raise AirflowException(
        f"Creating TPU VM {name} ({cfg.tpu.accelerator_type} in {cfg.tpu.zone}) failed: {error}; {cleanup}. "
        + (
            f"The zone had no capacity for tpu.stockout_wait_hours={cfg.tpu.stockout_wait_hours:g}: raise it, or "
            "try another tpu.zone, or tpu.provisioning=queued (waits in Google's queue for capacity)."
            if capacity(error) in ("stockout", "reserved")
            else "Retry, or try another tpu.zone / tpu.provisioning (on_demand, spot, queued)."
        )
    )


def delete_left(cfg: PipelineConfig, name: str) -> str | None:
    """Start deleting a node that never became READY (it bills meanwhile): the operation, or None if gone."""
    with use_connection(cfg.gcp_conn_id):
        return tpu.delete_node(cfg.tpu, name)


class _RunNodeOperator(BaseOperator):
    """What both take: the validated config (an XComArg or dict)."""

    template_fields = ("config",)

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config


class TpuVmCreateOperator(_RunNodeOperator):
    """Create (or reuse) the run's TPU VM and return {"name", "state", "workers"} once READY."""

    ui_color = "#d7e8fc"

    def execute(self, context: Context) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        if cfg.compute != "tpu_vm":
            raise AirflowSkipException(f"compute is {cfg.compute!r}: this run needs no TPU VM, none is made.")
        return self.resume(context)

    def resume(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        return drive_node(self, context, cfg, run_node_name(context), resume_in=self.resume, event=event)


class TpuVmDeleteOperator(_RunNodeOperator):
    """Delete the run's TPU VM and wait until it is gone; already gone counts as done. A teardown task."""

    ui_color = "#fcd7d7"

    def execute(self, context: Context) -> str | None:
        from google.api_core.exceptions import ClientError

        if self.config is None:  # validate failed: the run never came near create_tpu_vm
            raise AirflowSkipException("No validated config (validate did not succeed): this run made no TPU VM.")
        cfg = config_from_xcom(self.config)
        if cfg.compute != "tpu_vm":
            raise AirflowSkipException(f"compute is {cfg.compute!r}: this run made no TPU VM, none to delete.")
        name = run_node_name(context)
        with use_connection(cfg.gcp_conn_id):
            try:
                operation = tpu.delete_node(cfg.tpu, name)
            except ClientError as err:  # 4xx: a retry gets the same answer, and the VM keeps billing
                raise AirflowFailException(
                    f"The TPU API refused to delete TPU VM {name} ({err}); it keeps running, and billing. Fix "
                    f"the cause (connection {cfg.gcp_conn_id!r} needs roles/tpu.admin in {cfg.tpu.project}) and "
                    f"clear this task, or delete it by hand: {_delete_command(cfg, name)}"
                ) from err
        if operation is None:
            self._gone(cfg, name, "already gone")
            return None
        self.log.info(
            "TPU VM %s: deleting (%s); waiting until it is gone (at most tpu.delete_timeout_s=%ss).",
            *(name, operation, cfg.tpu.delete_timeout_s),
        )
        defer_to_node(self, cfg, name, cfg.tpu.delete_timeout_s, operation, self.deleted, until_gone=True)

    def deleted(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> str | None:
        cfg = config_from_xcom(self.config)
        event = event or {}
        name: str = event.get("name", "")
        state, error = event.get("state"), event.get("error")
        if state == tpu.NOT_FOUND and not error:
            self._gone(cfg, name, "deleted")
            return name
        if state == "TIMEOUT":
            self.log.warning(
                "TPU VM %s is %s after tpu.delete_timeout_s=%ss: left to mlm_tpu_janitor, which checks it hourly "
                "(it stays in the TPU registry, %s) and deletes it if it is still there once its expires label "
                "is past. To be sure now: %s",
                *(name, error, cfg.tpu.delete_timeout_s, tpu_registry.ENV, _delete_command(cfg, name)),
            )
            return name
        raise AirflowException(
            f"Deleting TPU VM {name} did not take: {error or 'the node is ' + str(state)}. It keeps running, and "
            f"billing: retry this task, or delete it by hand: {_delete_command(cfg, name)}"
        )

    def _gone(self, cfg: PipelineConfig, name: str, how: str) -> None:
        registry = tpu_registry.location(required=False)
        with use_connection(cfg.gcp_conn_id):
            if registry:
                tpu_registry.forget(registry, cfg.tpu.project, cfg.tpu.zone, name)
        self.log.info("TPU VM %s: %s (confirmed: the API no longer knows it).", name, how)


def _delete_command(cfg: PipelineConfig, name: str) -> str:
    return f"gcloud compute tpus tpu-vm delete {name} --zone {cfg.tpu.zone} --project {cfg.tpu.project}"
