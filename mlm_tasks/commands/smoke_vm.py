"""The smoke command's side of the TPU VM: the dry run's stand-in for the TPU API, the login to worker 0,
the image capture and the trainer's detached start."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mlm_tasks.commands.smoke_train import TrainingFailed
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job import launch as vm_job
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import runtimes, ssh

API = "https://tpu.googleapis.com/v2"


class DryRunApi:
    """Stands in for TpuClient: prints each request as the REST transport would send it, sends nothing."""

    def __init__(self, out: Callable[[str], None]):
        self.out = out

    def _request(self, method: str, path: str, operation: str, message: Any = None) -> SimpleNamespace:
        from google.protobuf import json_format

        line = f"{method} {API}/{path}"
        if message is not None:  # the body exactly as the REST transport serializes it (camelCase, no defaults)
            line += "\n" + json.dumps(json_format.MessageToDict(type(message).pb(message)), indent=2, sort_keys=True)
        self.out(line)
        return SimpleNamespace(operation=SimpleNamespace(name=operation))

    def get_node(self, name: str, **_: Any):
        from google.api_core.exceptions import NotFound

        self.out(f"GET {API}/{name}")
        raise NotFound(f"(dry run: {name} taken as absent)")

    get_queued_resource = get_node

    def create_node(self, parent: str, node_id: str, node: Any, **_: Any):
        return self._request("POST", f"{parent}/nodes?nodeId={node_id}", f"{parent}/operations/dry-run-create", node)

    def delete_node(self, name: str, **_: Any):
        return self._request("DELETE", name, f"{name.rsplit('/nodes/', 1)[0]}/operations/dry-run-delete")

    def create_queued_resource(self, parent: str, queued_resource_id: str, queued_resource: Any, **_: Any):
        path = f"{parent}/queuedResources?queuedResourceId={queued_resource_id}"
        return self._request("POST", path, f"{parent}/operations/dry-run-queue", queued_resource)

    def delete_queued_resource(self, request: Any, **_: Any):
        operation = f"{request.name.rsplit('/queuedResources/', 1)[0]}/operations/dry-run-delete"
        return self._request("DELETE", f"{request.name}?force={str(request.force).lower()}", operation)


def login_to(cfg: PipelineConfig, name: str, args: argparse.Namespace, api: Any) -> ssh.Connect:
    """connect(host) as --ssh-user with --ssh-key, pinned to the host keys the node published (as the DAG's)."""
    login = ssh.Login(
        args.ssh_user,
        f"--ssh-user {args.ssh_user} --ssh-key {args.ssh_key}",
        {"key_filename": args.ssh_key, "timeout": 30, "allow_agent": False, "look_for_keys": False},
    )
    return ssh.connector(
        lambda host: login, cfg.tpu.ssh_port, node=name, published=tpu.published_keys(cfg.tpu, name, api=api)
    )


def capture_command(cfg: PipelineConfig) -> str:
    """What prints the image's Python version and its packages, before anything is installed."""
    py = shlex.quote(cfg.tpu.python)
    return f"{py} -c 'import platform; print(platform.python_version())' && {py} -m pip freeze --all"


def capture_image(
    cfg: PipelineConfig,
    name: str,
    connect: ssh.Connect,
    host: str,
    out: Callable[[str], None],
    path: Path | None = None,
) -> Path:
    """Write worker 0's `pip freeze` into the runtime's image file (or `path`), marked as captured
    (make lock-vm then locks against it instead of resolving the image as of its date)."""
    runtime = runtimes.get(cfg.tpu.runtime_version)
    path = path or runtime.image_path
    lines: list[str] = []
    outcome = ssh.Session(connect, host, on_line=lines.append).run(capture_command(cfg))
    if outcome.exit_code != 0:
        raise RuntimeError(f"Capturing the image failed: {outcome.describe()}")
    python, *freeze = lines
    # The pty merges pip's warnings into the output: keep requirement lines only.
    pinned = sorted(line for line in freeze if re.fullmatch(r"[A-Za-z0-9._-]+==\S+", line))
    other = [line for line in freeze if re.match(r"[A-Za-z0-9._-]+ @ ", line)]  # not installable from an index
    path.write_text(
        f"# captured from TPU VM {name} ({cfg.tpu.accelerator_type}, {runtime.version}) on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())} by `python -m mlm_tasks.commands.smoke --capture-image`: "
        f"Python {python}.\n" + "".join(f"# not from an index: {line}\n" for line in other) + "\n".join(pinned) + "\n"
    )
    out(
        f"Captured {len(pinned)} packages of {runtime.version} into {path}: run `make lock-vm`, "
        "then the tests, and commit both files."
    )
    return path


def start_detached(
    cfg: PipelineConfig,
    run_id: str,
    name: str,
    node: tpu.NodeState,
    host: str,
    connect: ssh.Connect,
    command: str,
    out: Callable[[str], None],
) -> tuple[TrainJob, ssh.Connect]:
    """The trainer started detached on worker 0 (the run lock stops one left by an earlier start)."""
    session = ssh.Session(connect, host, on_line=lambda line: out(f"[worker 0] {line}"))
    outcome, job = vm_job.start(
        session,
        command,
        secret=None,
        node=name,
        node_created=node.created,
        host=host,
        try_number=1,
        workdir=cfg.tpu.workdir,
        output_root=cfg.output_root,
        run_id=run_id,
    )
    if outcome.exit_code != 0 or job is None:
        raise TrainingFailed(outcome.describe())
    out(f"Trainer started detached: pid {job['pid']} on {name}; its log: {cfg.tpu.workdir}/{job['log']}")
    return job, connect


def worker_0(
    cfg: PipelineConfig, name: str, node: tpu.NodeState, args: argparse.Namespace, out: Callable[[str], None]
) -> list[str]:
    """Worker 0's address once its port 22 answers (a dry run: what it would do)."""
    if args.dry_run:
        out(
            f"(dry run) would poll GET {API}/{tpu.full_name(cfg.tpu, name)} every {cfg.tpu.poll_interval_s:g}s "
            f"until READY, probe tcp:{cfg.tpu.ssh_port} on worker 0's {cfg.tpu.ssh_via} IP, then run there "
            f"as {args.ssh_user}, accepting only the host keys the node publishes (:getGuestAttributes):"
        )
        return ["<worker-0-ip>"]
    hosts = tpu.worker_endpoints(node, external=cfg.tpu.ssh_via == "external")
    problem = ssh.unreachable(hosts[0], cfg.tpu.ssh_port, ssh.PROBE_TIMEOUT_S)
    if problem:
        raise RuntimeError(
            f"Worker 0 is unreachable ({problem}): add a firewall rule allowing tcp:{cfg.tpu.ssh_port} "
            f"from this machine (gcloud compute firewall-rules create allow-ssh-smoke "
            f"--allow=tcp:{cfg.tpu.ssh_port} --source-ranges=<your IP>/32), or use --ssh-via internal "
            "from inside the VPC."
        )
    return hosts
