"""Queued resources: the run's node asked for through Google's queue, which waits for capacity (provisioning=queued).

op = queued.create(cfg.tpu, name, node)       # one node spec, node id = the QR id = the run's node name
queued.get_state(cfg.tpu, name).state         # ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, ...
queued.delete(cfg.tpu, name)                  # force: its node goes with it
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlm_tasks.tpu.calls import NAME_PREFIX, NOT_FOUND, answered, call, client, limits, parent

if TYPE_CHECKING:
    from google.cloud.tpu_v2 import Node, QueuedResource, TpuClient

    from mlm_tasks.config import TpuConfig

log = logging.getLogger(__name__)

# States a request leaves by itself; ACTIVE has its node; FAILED and SUSPENDED(ING) are dead ends.
WAIT_STATES = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "DELETING"})
DEAD_STATES = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})


@dataclass(frozen=True)
class QueuedState:
    name: str
    state: str  # the request's state name, or NOT_FOUND
    error: str | None = None  # FAILED: why (failedData.error.message)


def full_name(cfg: TpuConfig, name: str) -> str:
    return f"{parent(cfg)}/queuedResources/{name}"


def _state_of(qr: QueuedResource) -> QueuedState:
    error = (qr.state.failed_data.error.message or None) if "failed_data" in qr.state else None
    return QueuedState(name=qr.name.rsplit("/", 1)[-1], state=qr.state.state.name, error=error)


def get_state(cfg: TpuConfig, name: str, api: TpuClient | None = None) -> QueuedState:
    qr = call(cfg, api, "get_queued_resource", name, missing=True, name=full_name(cfg, name))
    return QueuedState(name=name, state=NOT_FOUND) if qr is None else _state_of(qr)


def request(cfg: TpuConfig, name: str, node: Node) -> QueuedResource:
    """The queued resource for `node` named `name`, with the run's tier, reservation and validity."""
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent(cfg), node_id=name, node=node)
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=int(cfg.queued_valid_hours * 3600))
        ),
        reservation_name=cfg.reservation or "",
    )
    if cfg.queued_tier == "spot":
        qr.spot = tpu_v2.QueuedResource.Spot()
    else:
        qr.guaranteed = tpu_v2.QueuedResource.Guaranteed()
    return qr


def create(cfg: TpuConfig, name: str, node: Node, api: TpuClient | None = None) -> str:
    """Queue the request for the node; returns the create operation's name."""
    qr = request(cfg, name, node)
    op = call(cfg, api, "create_queued_resource", name, parent=parent(cfg), queued_resource_id=name, queued_resource=qr)
    log.info(
        "Queued a request for TPU VM %s (%s, %s tier%s) in %s, valid %g h (tpu.queued_valid_hours).",
        name,
        cfg.accelerator_type,
        cfg.queued_tier,
        f", reservation {cfg.reservation}" if cfg.reservation else "",
        cfg.zone,
        cfg.queued_valid_hours,
    )
    return str(op.operation.name)


def delete(cfg: TpuConfig, name: str, api: TpuClient | None = None) -> str | None:
    """Delete the request and, with force, the node it made; the operation, or None when there was none."""
    from google.cloud import tpu_v2

    delete = tpu_v2.DeleteQueuedResourceRequest(name=full_name(cfg, name), force=True)
    op = call(cfg, api, "delete_queued_resource", name, missing=True, request=delete)
    if op is None:
        return None
    log.info("Deleting the queued resource %s (and its node) in %s.", name, cfg.zone)
    return str(op.operation.name)


def list_expired(cfg: TpuConfig, now: float | None = None) -> list[QueuedState]:
    """Requests named `mlm-*` whose node's `expires` label is in the past (the janitor's; a request left
    FAILED or SUSPENDED costs nothing, but its name blocks a new one)."""
    now = time.time() if now is None else now
    with answered(cfg, f"list_queued_resources {parent(cfg)}"):  # the pager fetches later pages as we iterate
        listed = [
            (_state_of(qr), dict(qr.tpu.node_spec[0].node.labels) if qr.tpu.node_spec else {})
            for qr in client(cfg).list_queued_resources(parent=parent(cfg), **limits())
        ]
    return [
        request
        for request, node_labels in listed
        if request.name.startswith(NAME_PREFIX) and node_labels.get("expires", "").isdigit()
        if int(node_labels["expires"]) < now
    ]
