"""The deployment's record of the TPU VMs it made, so mlm_tpu_janitor finds every one of them, whatever
project or zone a run chose (not only the zones the janitor is told about).

    root = tpu_registry.location()                          # MLM_TPU_REGISTRY, e.g. gs://bucket/mlm/tpu-registry
    tpu_registry.record(root, "proj", "us-central2-b", "mlm-pretrain-3f2a9c01bd", expires=1718000000)
    for entry in tpu_registry.entries(root): ...            # Entry(project, zone, name, expires, uri)
    tpu_registry.forget(root, "proj", "us-central2-b", "mlm-pretrain-3f2a9c01bd")
    tpu_registry.places_to_check("proj", ["us-central2-b"], entries)  # the janitor's (project, zone) pairs

One small JSON file per node, `<root>/<project>/<zone>/<name>.json`, written by the task that creates
the node and removed once the node is known to be gone (teardown confirmed it, or the janitor found
it gone). Why files under a deployment location rather than an Airflow Variable or the create tasks'
XCom: each create writes its own file, so two creates at once cannot lose each other's entry (one
Variable holding a list is a read-modify-write race); every Celery worker, whatever machine, and the
janitor read the same place when it is gs:// (or a volume they share); it goes through the storage
layer the artifacts use; and an entry outlives the metadata database (`airflow db clean` drops old
XCom, a cleared run rewrites it). A node recorded twice (a retry) is one file, rewritten.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal, overload

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import join

ENV = "MLM_TPU_REGISTRY"
_SAFE = re.compile(r"[a-z0-9][-a-z0-9.]*")  # what GCP allows in project ids, zones and node names


@dataclass(frozen=True)
class Entry:
    project: str
    zone: str
    name: str
    expires: int        # epoch seconds: the node's `expires` label when it was recorded
    uri: str            # the entry's file


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
        raise ConfigError(f"{ENV} is not set: set it in the environment of every Airflow worker and the "
                          "janitor to a folder they all share, e.g. gs://YOUR-BUCKET/mlm/tpu-registry (or a "
                          "shared volume), where each TPU VM the pipeline creates is recorded for mlm_tpu_janitor.")
    return root.rstrip("/")


def entry_uri(root: str, project: str, zone: str, name: str) -> str:
    for part in (project, zone, name):
        if not _SAFE.fullmatch(part):  # a path part: no "/" or ".." may reach the storage layer
            raise ConfigError(f"Not a GCP project, zone or node name: {part!r}.")
    return join(root, project, zone, f"{name}.json")


def record(root: str, project: str, zone: str, name: str, expires: int | str) -> str:
    uri = entry_uri(root, project, zone, name)
    storage.write_json(uri, {"project": project, "zone": zone, "name": name, "expires": int(expires)})
    return uri


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
                    found.append(Entry(data["project"], data["zone"], data["name"], int(data["expires"]), uri))
    return sorted(found, key=lambda e: (e.project, e.zone, e.name))


def places_to_check(project: str, zones: list[str], recorded: list[Entry]) -> list[tuple[str, str]]:
    """The janitor's (project, zone) pairs: its own project's zones, then every pair a recorded node is in."""
    pairs = [(project, zone) for zone in zones] + [(e.project, e.zone) for e in recorded]
    return list(dict.fromkeys(pairs))  # in order, once each
