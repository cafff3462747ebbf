"""Cloud TPU VM lifecycle on the TPU v2 API: make one node per run, reuse it on retries, clean up.

name = tpu.node_name("mlm_pretrain", run_id)            # mlm-pretrain-<hash>, same on every retry
state = tpu.ensure_node(cfg.tpu, name, tpu.labels(run_id, cfg.tpu.ttl_hours))   # never blocks
tpu.delete_node(cfg.tpu, name)
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from mlm_tasks.errors import AuthError
from mlm_tasks.tpu import queued
from mlm_tasks.tpu.calls import NAME_PREFIX, NOT_FOUND, answered, call, client, limits, parent

if TYPE_CHECKING:  # types only: config imports this package's tables, so tpu/ imports no config at run time
    from google.cloud.tpu_v2 import Node, TpuClient

    from mlm_tasks.config import TpuConfig


log = logging.getLogger(__name__)

# States that end by themselves; any other but READY (PREEMPTED, TERMINATED, ...) is replaced.
WAIT_STATES = frozenset(
    {"CREATING", "STARTING", "RESTARTING", "REPAIRING", "REIMAGING", "DELETING", "STOPPING", "UNHIDING"}
)
SCOPE = "https://www.googleapis.com/auth/cloud-platform"  # what the VM's service account may call
HOST_KEYS = "hostkeys"  # guest-attribute namespace where a VM's guest agent publishes its SSH host keys


@dataclass(frozen=True)
class NodeState:
    name: str  # node id, e.g. mlm-pretrain-3f2a9c01bd
    state: str  # API state name (READY, CREATING, ...) or NOT_FOUND
    action: str = "none"  # what ensure_node did: ready | wait | created | recreating
    workers: tuple[tuple[str, str], ...] = ()  # (internal ip, external ip) per worker, in order
    labels: dict[str, str] = field(default_factory=dict)
    operation: str | None = None  # long-running operation started by this call, if any
    created: float | None = None  # the node's createTime (epoch seconds): billing runs from then
    replaced: str = ""  # "recreating": the dead state (PREEMPTED, TERMINATED, ...) of the node being deleted
    error: str | None = None  # "refused": why the API refused the create (a quota)

    @property
    def ready(self) -> bool:
        return self.state == "READY"


def node_name(dag_id: str, run_id: str) -> str:
    """`mlm-<dag>-<hash of dag and run>`: a retry of the run finds the node the first try made."""
    digest = hashlib.sha1(f"{dag_id}/{run_id}".encode()).hexdigest()[:10]
    dag = re.sub(r"[^a-z0-9]+", "-", dag_id.lower()).strip("-").removeprefix(NAME_PREFIX)
    dag = dag[: 63 - len(NAME_PREFIX) - 1 - len(digest)].strip("-")
    return f"{NAME_PREFIX}{dag}-{digest}" if dag else f"{NAME_PREFIX}{digest}"


def labels(run_id: str, ttl_hours: float, now: float | None = None) -> dict[str, str]:
    """Labels on every node: which run made it and when the janitor may delete it (epoch seconds)."""
    now = time.time() if now is None else now
    return {
        "managed-by": "mlm-tasks",
        "run": re.sub(r"[^a-z0-9_-]+", "-", run_id.lower()).strip("-")[:63] or "run",
        "run-hash": hashlib.sha1(run_id.encode()).hexdigest()[:10],
        "created": str(int(now)),
        "expires": str(int(now + ttl_hours * 3600)),
    }


def full_name(cfg: TpuConfig, name: str) -> str:
    return f"{parent(cfg)}/nodes/{name}"


def _state_of(node: Node) -> NodeState:
    workers = tuple((e.ip_address, e.access_config.external_ip) for e in node.network_endpoints)
    stamp: Any = node.create_time  # proto-plus hands a datetime (its stubs say Timestamp); unset: None
    return NodeState(
        name=node.name.rsplit("/", 1)[-1],
        state=node.state.name,
        workers=workers,
        labels=dict(node.labels),
        created=stamp.timestamp() if stamp else None,
    )


def get_state(cfg: TpuConfig, name: str, api: TpuClient | None = None) -> NodeState:
    node = call(cfg, api, "get_node", name, missing=True, name=full_name(cfg, name))
    return NodeState(name=name, state=NOT_FOUND) if node is None else _state_of(node)


def passing(state: str) -> bool:
    """Whether the node (or its queued request, `QUEUED (...)`) leaves this state by itself."""
    return state in WAIT_STATES or state.startswith("QUEUED")


def node_now(
    cfg: TpuConfig, name: str, operation: str | None, api: TpuClient | None = None, until_gone: bool = False
) -> tuple[NodeState, str | None]:
    """The node, as `QUEUED (<state>)` while only its queued request waits (`until_gone`: while it exists), and
    the error that explains it: `operation`'s (asked after the node), or the request's FAILED."""
    api = api or client(cfg)
    node = get_state(cfg, name, api)
    error = operation_error(cfg, operation, api) if operation else None
    if cfg.provisioning == "queued" and node.state == NOT_FOUND:
        request = queued.get_state(cfg, name, api)
        if request.state in (*queued.WAIT_STATES, "ACTIVE") or (until_gone and request.state != NOT_FOUND):
            node = replace(node, state=f"QUEUED ({request.state})")
        elif request.state == "FAILED":
            error = error or (
                f"the queued resource is FAILED: {request.error or 'no reason given'} "
                f"(it could wait tpu.queued_valid_hours={cfg.queued_valid_hours:g})"
            )
    return node, error


def operation_error(cfg: TpuConfig, operation: str, api: TpuClient | None = None) -> str | None:
    """The error message of a finished long-running operation, or None (running or succeeded)."""
    from google.longrunning import operations_pb2

    op = call(cfg, api, "get_operation", operation, request=operations_pb2.GetOperationRequest(name=operation))
    if not (op.done and op.error.code):
        return None
    return f"{op.error.message or 'no message'} (code {op.error.code})"


def _new_node(cfg: TpuConfig, node_labels: dict[str, str], metadata: dict[str, str] | None) -> Node:
    from google.cloud import tpu_v2

    network = tpu_v2.NetworkConfig(
        network=cfg.network or "", subnetwork=cfg.subnetwork or "", enable_external_ips=cfg.external_ips
    )
    # OS Login ignores ssh-keys metadata, so it is off unless configured (the key then goes to OS Login).
    metadata = {**(metadata or {}), "enable-oslogin": "TRUE" if cfg.enable_oslogin else "FALSE"}
    return tpu_v2.Node(
        accelerator_type=cfg.accelerator_type,
        runtime_version=cfg.runtime_version,
        labels=node_labels,
        metadata=metadata,
        network_config=network,
        scheduling_config=tpu_v2.SchedulingConfig(spot=cfg.provisioning == "spot"),
        # An empty email: the project's default compute account; the scope lets the VM reach GCS.
        service_account=tpu_v2.ServiceAccount(email=cfg.service_account or "", scope=[SCOPE]),
    )


def ensure_node(
    cfg: TpuConfig,
    name: str,
    node_labels: dict[str, str],
    metadata: dict[str, str] | None = None,
    api: TpuClient | None = None,
) -> NodeState:
    """Make sure node `name` exists or is on its way: READY -> "ready"; a passing state or a lost create race
    -> "wait"; a dead end -> delete started ("recreating"); NOT_FOUND -> "created", or "refused" (quota, in
    `error`)."""
    from google.api_core.exceptions import Conflict, TooManyRequests

    api = api or client(cfg)
    current = get_state(cfg, name, api)
    if current.state == "READY":
        # Reused by a retry or a later step: the janitor must not take it while this run still works.
        refresh_expiry(cfg, current, node_labels.get("expires"), api)
        return replace(current, action="ready")
    if current.state in WAIT_STATES:
        return replace(current, action="wait")
    if current.state != NOT_FOUND:
        log.warning("TPU VM %s is %s and will not become READY: deleting it to make a fresh one.", name, current.state)
        op_name = delete_node(cfg, name, api)
        return replace(current, state="DELETING", action="recreating", operation=op_name, replaced=current.state)
    if cfg.provisioning == "queued":
        return _ensure_queued(cfg, name, node_labels, metadata, api)
    try:
        new = _new_node(cfg, node_labels, metadata)
        op = call(cfg, api, "create_node", name, parent=parent(cfg), node_id=name, node=new)
    except Conflict:  # another try created it between our get and create: wait for that one
        return NodeState(name=name, state="CREATING", action="wait")
    except TooManyRequests as err:  # a busy API's 429 was retried (calls.py); a quota's is the answer
        return NodeState(name=name, state=NOT_FOUND, action="refused", error=f"{err.message} (code 8)")
    log.info("Creating TPU VM %s (%s, %s) in %s.", name, cfg.accelerator_type, cfg.runtime_version, cfg.zone)
    return NodeState(name=name, state="CREATING", action="created", labels=node_labels, operation=op.operation.name)


def _ensure_queued(
    cfg: TpuConfig, name: str, node_labels: dict[str, str], metadata: dict[str, str] | None, api: TpuClient
) -> NodeState:
    """No node yet, tpu.provisioning=queued: its request waiting ("wait"), queued now ("created"), or a dead
    one (FAILED, SUSPENDED) deleted to be queued anew ("recreating")."""
    request = queued.get_state(cfg, name, api)
    if request.state in queued.WAIT_STATES or request.state == "ACTIVE":  # ACTIVE: its node is being listed
        return NodeState(name=name, state=f"QUEUED ({request.state})", action="wait")
    if request.state in queued.DEAD_STATES:
        log.warning("The queued resource %s is %s (%s): deleting it to queue anew.", name, request.state, request.error)
        op = queued.delete(cfg, name, api)
        return NodeState(name=name, state="DELETING", action="recreating", operation=op, replaced=request.state)
    op_name = queued.create(cfg, name, _new_node(cfg, node_labels, metadata), api)
    return NodeState(name=name, state="QUEUED", action="created", labels=node_labels, operation=op_name)


def delete_node(cfg: TpuConfig, name: str, api: TpuClient | None = None) -> str | None:
    """Start deleting node `name` (with tpu.provisioning=queued, its queued resource, which takes the node with
    it); returns the operation name, or None when it is already gone."""
    api = api or client(cfg)
    if cfg.provisioning == "queued":
        op_name = queued.delete(cfg, name, api)
        if op_name is not None:
            return op_name
    op = call(cfg, api, "delete_node", name, missing=True, name=full_name(cfg, name))
    if op is None:
        return None
    log.info("Deleting TPU VM %s in %s.", name, cfg.zone)
    return op.operation.name


def refresh_expiry(cfg: TpuConfig, node: NodeState, expires: str | None, api: TpuClient | None = None) -> str | None:
    """Move the node's `expires` label to `expires` (epoch seconds) when that is later; the update operation,
    or None when nothing changed."""
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    old = node.labels.get("expires", "")
    if not expires or (old.isdigit() and int(old) >= int(expires)):
        return None
    labelled = tpu_v2.Node(name=full_name(cfg, node.name), labels={**node.labels, "expires": expires})
    op = call(cfg, api, "update_node", node.name, node=labelled, update_mask=field_mask_pb2.FieldMask(paths=["labels"]))
    log.info("TPU VM %s reused: its expires label moves from %s to %s.", node.name, old or "none", expires)
    return op.operation.name


def list_expired(cfg: TpuConfig, now: float | None = None) -> list[NodeState]:
    """Nodes named `mlm-*` whose `expires` label is in the past; nodes without one are left alone
    (we did not make them, or someone labelled them by hand)."""
    now = time.time() if now is None else now
    with answered(cfg, f"list_nodes {parent(cfg)}"):  # the pager fetches later pages as we iterate
        listed = [_state_of(node) for node in client(cfg).list_nodes(parent=parent(cfg), **limits())]
    return [
        node
        for node in listed
        if node.name.startswith(NAME_PREFIX) and node.labels.get("expires", "").isdigit()
        if int(node.labels["expires"]) < now
    ]


def worker_endpoints(node: NodeState, external: bool = False) -> list[str]:
    """IP of each worker, worker 0 first (the order TPU runtimes number the hosts)."""
    ips = [ext if external else internal for internal, ext in node.workers]
    if not all(ips):
        kind = "external" if external else "internal"
        raise RuntimeError(
            f"TPU VM {node.name} has a worker without an {kind} IP ({node.workers}): "
            "set tpu.external_ips=true (or tpu.ssh_via=internal inside the VPC)."
        )
    return ips


def host_keys(cfg: TpuConfig, name: str, worker: int = 0, api: TpuClient | None = None) -> dict[str, str]:
    """SSH host keys worker `worker` of node `name` published (guest attributes `hostkeys/`), as {type: base64
    key}; {} while none are; a refusal is an AuthError. docs/google-cloud.md#host-keys-on-first-contact."""
    from google.api_core.exceptions import BadRequest, FailedPrecondition, Forbidden, NotFound
    from google.cloud import tpu_v2

    request = tpu_v2.GetGuestAttributesRequest(
        name=full_name(cfg, name), query_path=f"{HOST_KEYS}/", worker_ids=[str(worker)]
    )
    try:
        with answered(cfg, f"get_guest_attributes {name}"):
            answer = (api or client(cfg)).get_guest_attributes(request=request, **limits(30.0))
    except NotFound:
        return {}
    except (Forbidden, BadRequest) as err:
        # The policy's refusal is undocumented: FAILED_PRECONDITION over gRPC, a 400 naming guest attributes over
        # REST; any other 400 is ours.
        refused = isinstance(err, Forbidden | FailedPrecondition) or "guest attribute" in str(err.message).lower()
        if not refused:
            raise
        raise AuthError(
            f"The TPU API refused to read node {name}'s guest attributes ({err.code} {err.message}), where its "
            "guest agent publishes the SSH host keys the login is pinned to. Either the organisation policy "
            "constraints/compute.disableGuestAttributesAccess is enforced on this project (lift it for the "
            "project), or the GCP connection lacks tpu.nodes.getGuestAttributes (roles/tpu.admin has it). "
            'If neither can change: "no_host_key_check": true in the SSH connection\'s extra skips the pin, '
            "and anyone answering at the worker's IP is then trusted (gcloud goes on without the keys too)."
        ) from err
    keys: dict[str, str] = {}
    for attributes in answer.guest_attributes:
        for item in attributes.query_value.items:
            parts = item.value.split()
            if item.namespace != HOST_KEYS or not parts:
                continue
            # The agent publishes the key's base64 alone; tolerate a whole `type key [comment]` line.
            keys[item.key] = parts[1] if len(parts) > 1 and parts[0] == item.key else parts[0]
    return keys


class NodeNotReady(RuntimeError):
    """The node publishes no host keys because it is not READY (preempted, stopped, being deleted)."""


def published_keys(cfg: TpuConfig, name: str, api: TpuClient | None = None) -> Callable[[int], dict[str, str]]:
    """ssh.connector's `published` for node `name`: worker -> host_keys. No keys on a READY node: its guest
    agent is still starting (the connector waits); on any other, NodeNotReady at once (it never publishes)."""

    def published(worker: int) -> dict[str, str]:
        keys = host_keys(cfg, name, worker, api=api)
        if not keys and not (node := get_state(cfg, name, api=api)).ready:
            raise NodeNotReady(
                f"Node {name} is {node.state}: it publishes no SSH host keys and takes no SSH "
                "until it is READY again (a preempted node never is: a retry replaces it)."
            )
        return keys

    return published


def describe(state: NodeState) -> dict[str, Any]:
    """A JSON-safe summary for XCom and logs."""
    return {"name": state.name, "state": state.state, "workers": [list(w) for w in state.workers]}
