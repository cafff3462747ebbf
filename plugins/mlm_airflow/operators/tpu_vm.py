"""Airflow operators that make and remove the run's TPU VM (Google Cloud path).

    config = validate()                    # the validated config (an XComArg), plugins/mlm_airflow/tasks/steps.py
    create = TpuVmCreateOperator(task_id="create_tpu_vm", config=config)
    [create, train] >> TpuVmDeleteOperator(task_id="delete_tpu_vm", config=config).as_teardown()

Both end skipped, saying why in their log, unless `compute` is "tpu_vm": the grid then does not read
as if a VM had been made. Create is a plain task, not a setup, because Airflow skips everything in a
skipped setup's scope: train follows it with none_failed. Delete is a teardown without a setup: it
runs once its upstreams are done, whatever happened. The node is named from the DAG and run ids
(`mlm_tasks.tpu.api.node_name`), so a retry finds the node the first try made. Create is idempotent
(READY reused, dead nodes replaced) and deferrable: while the node is CREATING it waits in the
triggerer (plugins/mlm_airflow/triggers/tpu_vm.py), not in a worker slot. Every TPU API call uses the credentials of the
run's Airflow GCP connection (`gcp_conn_id`). If creation fails after the node appeared,
the node is deleted before the task fails, so no half-made VM is left behind. A stockout (the zone has no
capacity for the slice) does not fail the try: the node is deleted and created again every
`tpu.stockout_retry_s`, deferred in between, for up to `tpu.stockout_wait_hours` (wait_out_stockout).
`create_or_reuse_node` is that logic as a function of the operator that waits (its `resume` method
takes the trigger's event to `node_from_event`); the train step uses it, through `node_for_step`, to
replace a node preempted mid-run.
Before it creates (or reuses) a node it records it in the deployment's registry
(`mlm_tasks.tpu.registry`, MLM_TPU_REGISTRY), where mlm_tpu_janitor finds it whatever its zone.

Delete confirms: it sends the delete, then waits in the triggerer (the same TpuNodeTrigger) until
the node is gone (NOT_FOUND), at most `tpu.delete_timeout_s`; at that bound it leaves the node to
the janitor and says so. A delete the API refuses (403, 400, ...) or whose operation fails fails the
task, naming the node and how to delete it by hand.
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
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import registry as tpu_registry
from mlm_tasks.tpu.job import Log


def run_node_name(context: Context, override: str | None = None) -> str:
    return override or tpu.node_name(context["dag"].dag_id, context["run_id"])


def ssh_key_metadata(conn_id: str, log: Log) -> dict[str, str]:
    """`ssh-keys` metadata for the node: the public half of the SSH connection's key, so the SSH step
    can log in without OS Login. Projects that enforce OS Login ignore it (grant the key there)."""
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


def create_or_reuse_node(
    op: BaseOperator,
    context: Context,
    cfg: PipelineConfig,
    name: str,
    deadline: float,
    *,
    resume_in: Callable[..., Any],
    stockout_until: float | None = None,
) -> dict[str, Any]:
    """The run's node READY (`tpu.describe` of it): reused, created, or a dead one replaced. Until it is READY
    `op` defers to TpuNodeTrigger and the task resumes in `resume_in` (a method of `op`, which hands the
    event to `node_from_event`); `deadline` (epoch seconds) bounds the wait for this create.
    `stockout_until`: set while a stockout is being waited out (see wait_out_stockout)."""
    metadata = ssh_key_metadata(cfg.tpu.ssh_conn_id, op.log)
    node_labels = tpu.labels(context["run_id"], cfg.tpu.ttl_hours)
    registry = tpu_registry.location()  # unset: fail before anything is made that nobody would find
    with use_connection(cfg.gcp_conn_id):
        # First: a node that exists is always one the janitor knows about.
        tpu_registry.record(registry, cfg.tpu.project, cfg.tpu.zone, name, node_labels["expires"])
        state = tpu.ensure_node(cfg.tpu, name, node_labels, metadata)
        op.log.info("TPU VM %s: %s (%s).", name, state.state, state.action)
    if state.ready:
        return tpu.describe(state)
    operation = state.operation if state.action == "created" else None
    defer_to_node(op, cfg, name, deadline, operation, resume_in.__name__, stockout_until=stockout_until)


def defer_to_node(
    op: BaseOperator,
    cfg: PipelineConfig,
    name: str,
    deadline: float,
    operation: str | None,
    method_name: str,
    resume_kwargs: dict[str, Any] | None = None,
    **trigger_args: Any,
) -> NoReturn:
    """Defer `op` to TpuNodeTrigger for node `name` until `deadline` (epoch seconds), resuming in `method_name`.
    The trigger enforces the deadline itself (so the task can clean up); Airflow's timeout is only a backstop."""
    trigger = TpuNodeTrigger(
        cfg.tpu.model_dump(mode="json"),
        name,
        deadline,
        operation,
        cfg.tpu.poll_interval_s,
        gcp_conn_id=cfg.gcp_conn_id,
        **trigger_args,
    )
    op.defer(
        trigger=trigger,
        method_name=method_name,
        kwargs=resume_kwargs,
        timeout=timedelta(seconds=max(0.0, deadline - time.time()) + 600),
    )


def node_from_event(
    op: BaseOperator,
    context: Context,
    cfg: PipelineConfig,
    event: dict[str, Any] | None,
    *,
    resume_in: Callable[..., Any],
) -> dict[str, Any]:
    """The READY node TpuNodeTrigger's event reports. A node gone before the deadline (the dead one it
    replaces, deleted) is created again, deferring once more; any other end deletes what is left of the
    node and fails the task, naming what to try."""
    event = event or {}
    name: str = event.get("name", "")
    state, error = event.get("state"), event.get("error")
    if state == "READY" and not error:
        op.log.info("TPU VM %s is READY: %s", name, event["node"]["workers"])
        return event["node"]
    stockout_until = event.get("stockout_until")
    if state == tpu.NOT_FOUND and not error and time.time() < event.get("deadline", 0):
        why = "the node that had no capacity deleted" if stockout_until else "replaced node deleted"
        op.log.info("TPU VM %s is gone (%s): creating it again.", name, why)
        return create_or_reuse_node(
            op, context, cfg, name, event["deadline"], resume_in=resume_in, stockout_until=stockout_until
        )
    if tpu.is_stockout(error) and cfg.tpu.stockout_wait_hours > 0:
        until = stockout_until or time.time() + cfg.tpu.stockout_wait_hours * 3600
        if time.time() + cfg.tpu.stockout_retry_s < until:
            wait_out_stockout(op, cfg, name, str(error), until, resume_in=resume_in)  # defers
    deleted = None
    if state != tpu.NOT_FOUND or cfg.tpu.provisioning == "queued":  # a FAILED request has no node, and is left
        deleted = delete_left(cfg, name)
    cleanup = "deleted it" if deleted else "nothing left to delete"
    if state == "TIMEOUT":
        queued = f"tpu.queued_valid_hours={cfg.tpu.queued_valid_hours:g} + " if cfg.tpu.provisioning == "queued" else ""
        raise AirflowException(
            f"TPU VM {name} was not READY within {queued}tpu.create_timeout_s={cfg.tpu.create_timeout_s}s "
            f"({error}); {cleanup}. Retry later, raise the timeout, or pick another tpu.zone."
        )
    raise AirflowException(
        f"Creating TPU VM {name} ({cfg.tpu.accelerator_type} in {cfg.tpu.zone}) failed: "
        f"{error or 'node is ' + str(state)}; {cleanup}. "
        + (
            f"The zone had no capacity for tpu.stockout_wait_hours={cfg.tpu.stockout_wait_hours:g}: raise it, or "
            "try another tpu.zone, or tpu.provisioning=queued (waits in Google's queue for capacity)."
            if tpu.is_stockout(error)
            else "Retry, or try another tpu.zone / tpu.provisioning (on_demand, spot, queued)."
        )
    )


def wait_out_stockout(
    op: BaseOperator,
    cfg: PipelineConfig,
    name: str,
    error: str,
    until: float,
    *,
    resume_in: Callable[..., Any],
) -> NoReturn:
    """The zone has no capacity for the slice: delete what the failed create left (billed while it exists),
    then defer until it is gone and `tpu.stockout_retry_s` has passed; the event (NOT_FOUND) brings the task
    back to node_from_event, which creates the node again, in the same try, until `until` (epoch seconds:
    `tpu.stockout_wait_hours` after the first stockout). Raises TaskDeferred."""
    operation = delete_left(cfg, name)
    retry_at = time.time() + cfg.tpu.stockout_retry_s
    op.log.warning(
        "No capacity for %s in %s (%s): deleted what the create left; creating TPU VM %s again at %s UTC, and "
        "every %gs until %s UTC (tpu.stockout_wait_hours=%g), in this try. Waiting longer costs nothing; to get "
        "a node sooner, try another tpu.zone, or tpu.provisioning=queued with a reservation.",
        cfg.tpu.accelerator_type,
        cfg.tpu.zone,
        error,
        name,
        time.strftime("%H:%M:%S", time.gmtime(retry_at)),
        cfg.tpu.stockout_retry_s,
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(until)),
        cfg.tpu.stockout_wait_hours,
    )
    deadline = retry_at + cfg.tpu.create_timeout_s  # for the node to be gone; then for the next create
    defer_to_node(
        op,
        cfg,
        name,
        deadline,
        operation,
        resume_in.__name__,
        until_gone=True,
        not_before=retry_at,
        stockout_until=until,
    )


def delete_left(cfg: PipelineConfig, name: str) -> str | None:
    """Start deleting a node that never became the run's READY node (it is billed while it exists); the
    delete operation, or None when it was gone."""
    with use_connection(cfg.gcp_conn_id):
        return tpu.delete_node(cfg.tpu, name)


def node_for_step(
    op: BaseOperator, context: Context, cfg: PipelineConfig, name: str, *, replace_in: Callable[..., Any] | None
) -> tpu.NodeState:
    """The node a step runs on, READY. A dead one (preempted, deleted) is replaced first when `replace_in`
    is given (a resume method of `op`: see create_or_reuse_node); else the task fails, naming the fix."""
    node = tpu.get_state(cfg.tpu, name)
    if node.ready:
        return node
    if replace_in is None:
        raise AirflowException(
            f"TPU VM {name} is {node.state}, not READY: clear the create_tpu_vm "
            "task (it replaces a dead node) and this one."
        )
    # create_tpu_vm is not rerun on a retry of this task: replace a preempted (or deleted) node here.
    op.log.warning("TPU VM %s is %s, not READY (preempted?): getting a READY one before the step.", name, node.state)
    replaced = create_or_reuse_node(op, context, cfg, name, time.time() + cfg.tpu.create_wait_s(), resume_in=replace_in)
    return tpu.get_state(cfg.tpu, replaced["name"])


class _RunNodeOperator(BaseOperator):
    """What both take: the validated config (an XComArg or dict) and, optionally, a fixed node name."""

    template_fields = ("config", "node_name")

    def __init__(self, *, config: Any, node_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.node_name = node_name


class TpuVmCreateOperator(_RunNodeOperator):
    """Create (or reuse) the run's TPU VM and return {"name", "state", "workers"} once READY."""

    ui_color = "#d7e8fc"

    def execute(self, context: Context) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        if cfg.compute != "tpu_vm":
            raise AirflowSkipException(f"compute is {cfg.compute!r}: this run needs no TPU VM, none is made.")
        deadline = time.time() + cfg.tpu.create_wait_s()  # with provisioning=queued, the queue's validity too
        return create_or_reuse_node(
            self, context, cfg, run_node_name(context, self.node_name), deadline, resume_in=self.resume
        )

    def resume(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        return node_from_event(self, context, config_from_xcom(self.config), event, resume_in=self.resume)


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
        name = run_node_name(context, self.node_name)
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
            name,
            operation,
            cfg.tpu.delete_timeout_s,
        )
        deadline = time.time() + cfg.tpu.delete_timeout_s
        defer_to_node(self, cfg, name, deadline, operation, "deleted", until_gone=True)

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
                name,
                error,
                cfg.tpu.delete_timeout_s,
                tpu_registry.ENV,
                _delete_command(cfg, name),
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
