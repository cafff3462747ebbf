"""The deployment's record of the TPU VMs it made, so mlm_tpu_janitor finds every one, whatever project or zone:
one JSON file per node, `<root>/<project>/<zone>/<name>.json`, written before the node exists.

    root = tpu_registry.location()                          # MLM_TPU_REGISTRY, e.g. gs://bucket/mlm/tpu-registry
    tpu_registry.record(root, "proj", "us-central2-b", "mlm-pretrain-3f2a9c01bd", expires=1718000000)
    sweep = tpu_registry.delete_expired(api, zones, root)   # mlm_tpu_janitor: every expired mlm-* node
    tpu_registry.forget_gone(api, root)                      # then the entries of nodes that are gone
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, overload

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import join
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import queued

if TYPE_CHECKING:  # types only: config imports this package's tables, so tpu/ imports no config at run time
    from collections.abc import Callable

    from mlm_tasks.config import TpuConfig

log = logging.getLogger(__name__)

ENV = "MLM_TPU_REGISTRY"
_SAFE = re.compile(r"[a-z0-9][-a-z0-9.]*")  # what GCP allows in project ids, zones and node names


@dataclass(frozen=True)
class Entry:
    project: str
    zone: str
    name: str
    expires: int  # epoch seconds: the node's `expires` label when it was recorded


@overload
def location(required: Literal[True] = True) -> str: ...


@overload
def location(required: bool) -> str | None: ...


def location(required: bool = True) -> str | None:
    """The registry's root, from the deployment's environment; unset is an error that says what to set
    (or None when not `required`: forgetting a node needs no registry)."""
    root = os.environ.get(ENV, "").strip()
    if not root and not required:
        return None
    if not root:
        raise ConfigError(
            f"{ENV} is not set: set it in the environment of every Airflow worker and the "
            "janitor to a folder they all share, e.g. gs://YOUR-BUCKET/mlm/tpu-registry (or a "
            "shared volume), where each TPU VM the pipeline creates is recorded for mlm_tpu_janitor."
        )
    return root.rstrip("/")


def entry_uri(root: str, project: str, zone: str, name: str) -> str:
    for part in (project, zone, name):
        if not _SAFE.fullmatch(part):  # a path part: no "/" or ".." may reach the storage layer
            raise ConfigError(f"Not a GCP project, zone or node name: {part!r}.")
    return join(root, project, zone, f"{name}.json")


def record(root: str, project: str, zone: str, name: str, expires: int | str) -> None:
    entry = {"project": project, "zone": zone, "name": name, "expires": int(expires)}
    storage.write_json(entry_uri(root, project, zone, name), entry)


def forget(root: str, project: str, zone: str, name: str) -> None:
    storage.remove(entry_uri(root, project, zone, name))


def entries(root: str) -> list[Entry]:
    """Every recorded node, sorted by (project, zone, name)."""
    found = []
    for project_dir in storage.subdirs(root):
        for zone_dir in storage.subdirs(project_dir):
            for uri in storage.listdir(zone_dir):
                if uri.endswith(".json") and ".tmp-" not in uri:
                    data = storage.read_json(uri)
                    found.append(Entry(data["project"], data["zone"], data["name"], int(data["expires"])))
    return sorted(found, key=lambda e: (e.project, e.zone, e.name))


def places_to_check(project: str, zones: list[str], recorded: list[Entry]) -> list[tuple[str, str]]:
    """The janitor's (project, zone) pairs: its own project's zones, then every pair a recorded node is in."""
    pairs = [(project, zone) for zone in zones] + [(e.project, e.zone) for e in recorded]
    return list(dict.fromkeys(pairs))  # in order, once each


def _at(api: TpuConfig, project: str, zone: str) -> TpuConfig:
    """`api`'s TPU API settings for another (project, zone), validated as a run's are (it enters a path)."""
    return api.model_validate({**api.model_dump(), "project": project, "zone": zone})


@dataclass
class Sweep:
    """What one janitor run did: `zone/name` of each node deleted or refused, the zones it could not list."""

    deleted: list[str] = field(default_factory=list)
    undeleted: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)

    def problems(self, conn_id: str) -> str | None:
        """Why the janitor's task fails (None: it does not), naming every zone and node and what to check."""
        problems = []
        if self.unlisted:
            problems.append(
                f"Could not list TPU VMs in zone(s) {self.unlisted}: check the zone names and that "
                f"connection {conn_id!r} may list TPU nodes (roles/tpu.admin)."
            )
        if self.undeleted:
            problems.append(
                f"Could not delete TPU VM(s) {self.undeleted} (they still cost money): check that "
                f"connection {conn_id!r} may delete TPU nodes (roles/tpu.admin), or "
                "delete them by hand with `gcloud compute tpus tpu-vm delete NAME --zone ZONE`."
            )
        return " ".join(problems) or None

    def delete(self, cfg: TpuConfig, what: str, name: str, delete: Callable[[TpuConfig, str], Any]) -> None:
        """One delete; a refusal is logged and counted, never raised: it must not spare the others."""
        from google.api_core.exceptions import GoogleAPICallError

        try:
            delete(cfg, name)
        except GoogleAPICallError as err:
            log.error("Cannot delete %s %s in %s/%s: %s", what, name, cfg.project, cfg.zone, err)
            self.undeleted.append(f"{cfg.zone}/{name}")
            return
        self.deleted.append(f"{cfg.zone}/{name}")


def delete_expired(api: TpuConfig, zones: list[str], root: str) -> Sweep:
    """Deletes the expired `mlm-*` nodes (and their queued resources) in `zones` of api.project and wherever the
    registry under `root` says a node was made; one zone's or one node's trouble spares none of the others."""
    from google.api_core.exceptions import GoogleAPICallError

    sweep = Sweep()
    for project, zone in places_to_check(api.project, zones, entries(root)):
        cfg = _at(api, project, zone)
        try:
            expired_nodes = tpu.list_expired(cfg)
            expired_requests = queued.list_expired(cfg)  # tpu.provisioning=queued: the request, with its node
        except GoogleAPICallError as err:  # one zone's trouble must not spare the others' VMs
            log.error("Cannot list TPU VMs in %s/%s: %s", cfg.project, zone, err)
            sweep.unlisted.append(zone)
            continue
        for request in expired_requests:
            log.info("Deleting the queued resource %s in %s (%s) and its node.", request.name, zone, request.state)
            sweep.delete(cfg, "the queued resource", request.name, queued.delete)
        requested = {request.name for request in expired_requests}
        for node in (n for n in expired_nodes if n.name not in requested):  # those went with their request
            expired = datetime.fromtimestamp(int(node.labels["expires"]), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            run = node.labels.get("run", "?")
            log.info("Deleting TPU VM %s in %s (%s, run %s, expired %s).", node.name, zone, node.state, run, expired)
            sweep.delete(cfg, "TPU VM", node.name, tpu.delete_node)
    log.info("Deleted %d expired TPU VM(s) in %s %s: %s", len(sweep.deleted), api.project, zones, sweep.deleted)
    return sweep


def forget_gone(api: TpuConfig, root: str) -> list[str]:
    """Drops the entries of recorded nodes the TPU API no longer knows; `project/zone/name` of each. A node
    that cannot be checked is kept, and looked at again on the next run."""
    from google.api_core.exceptions import GoogleAPICallError

    forgotten = []
    for entry in entries(root):
        cfg = _at(api, entry.project, entry.zone)
        try:
            state = tpu.get_state(cfg, entry.name).state
        except GoogleAPICallError as err:  # kept, and looked at again next hour
            log.warning("Cannot check TPU VM %s in %s/%s: %s", entry.name, entry.project, entry.zone, err)
            continue
        if state == tpu.NOT_FOUND:
            forget(root, entry.project, entry.zone, entry.name)
            forgotten.append(f"{entry.project}/{entry.zone}/{entry.name}")
    log.info("Forgot %d gone TPU VM(s) of the registry: %s", len(forgotten), forgotten)
    return forgotten
