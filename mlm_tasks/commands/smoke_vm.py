"""The smoke command's side of the TPU VM: the dry run's stand-in for the TPU API, the login to worker 0,
the image capture and the trainer's detached start.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlm_tasks.commands.smoke_train import TrainingFailed
from mlm_tasks.config import PipelineConfig
from mlm_tasks.job import launch as vm_job
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh

API = "https://tpu.googleapis.com/v2"


class DryRunApi:
    """Stands in for TpuClient: prints each request as the REST transport would send it, sends nothing."""

    def __init__(self, out: Callable[[str], None]):
        self.out = out

    def _print(self, method: str, path: str, body: Any = None) -> None:
        self.out(f"{method} {API}/{path}" + (f"\n{json.dumps(body, indent=2, sort_keys=True)}" if body else ""))

    def get_node(self, name: str, **_: Any):
        from google.api_core.exceptions import NotFound

        self._print("GET", name)
        raise NotFound(f"(dry run: {name} taken as absent)")

    def create_node(self, parent: str, node_id: str, node: Any, **_: Any):
        from google.cloud import tpu_v2
        from google.protobuf import json_format

        # The body exactly as the REST transport serializes it (camelCase, defaults left out).
        body = json_format.MessageToDict(tpu_v2.Node.pb(node))
        self._print("POST", f"{parent}/nodes?nodeId={node_id}", body)
        return _Op(f"{parent}/operations/dry-run-create")

    def delete_node(self, name: str, **_: Any):
        self._print("DELETE", name)
        return _Op(f"{name.rsplit('/nodes/', 1)[0]}/operations/dry-run-delete")

    def get_queued_resource(self, name: str, **_: Any):
        from google.api_core.exceptions import NotFound

        self._print("GET", name)
        raise NotFound(f"(dry run: {name} taken as absent)")

    def create_queued_resource(self, parent: str, queued_resource_id: str, queued_resource: Any, **_: Any):
        from google.cloud import tpu_v2
        from google.protobuf import json_format

        body = json_format.MessageToDict(tpu_v2.QueuedResource.pb(queued_resource))
        self._print("POST", f"{parent}/queuedResources?queuedResourceId={queued_resource_id}", body)
        return _Op(f"{parent}/operations/dry-run-queue")

    def delete_queued_resource(self, request: Any, **_: Any):
        self._print("DELETE", f"{request.name}?force={str(request.force).lower()}")
        return _Op(f"{request.name.rsplit('/queuedResources/', 1)[0]}/operations/dry-run-delete")


class _Op:
    def __init__(self, name: str):
        self.operation = type("Operation", (), {"name": name})()


def login_to(cfg: PipelineConfig, name: str, args: argparse.Namespace, api: Any) -> ssh.Connect:
    """connect(host) as --ssh-user with --ssh-key, accepting only the host keys the node published
    (as the DAG's SSH step does)."""
    login = ssh.Login(
        args.ssh_user,
        f"--ssh-user {args.ssh_user} --ssh-key {args.ssh_key}",
        {"key_filename": args.ssh_key, "timeout": 30, "allow_agent": False, "look_for_keys": False},
    )
    return ssh.connector(
        lambda host: login, cfg.tpu.ssh_port, node=name, published=tpu.published_keys(cfg.tpu, name, api=api)
    )


def run_on_worker_0(connect: ssh.Connect, host: str, command: str, on_line: Callable[[str], None]) -> ssh.Outcome:
    """`command` on worker 0 (the smoke slices are one host; a pod slice runs on worker 0 too)."""
    return ssh.Session(connect, host, on_line=on_line).run(command)


def capture_command(cfg: PipelineConfig) -> str:
    """What prints the image's Python version and its packages, before anything is installed."""
    import shlex

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
    import re

    from mlm_tasks.tpu import runtimes

    runtime = runtimes.get(cfg.tpu.runtime_version)
    path = path or runtime.image_path
    lines: list[str] = []
    outcome = run_on_worker_0(connect, host, capture_command(cfg), lines.append)
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
