r"""Real-cloud smoke test: one tiny training on a real TPU VM, then the VM is deleted, whatever happens.

    python -m mlm_tasks.smoke --project my-project --zone us-west4-a --bucket gs://my-bucket/smoke \
        --ssh-key ~/.ssh/id_ed25519 [--accelerator v5litepod-1] [--provisioning queued] [--dry-run] [--capture-image]

Why it is built so: it sends the DAG's own TPU VM request (or queued resource: --provisioning) and runs the
real bootstrap and `python -m mlm_tasks train` on worker 0, detached and followed as the DAG's train task does
(mlm_tasks/smoke_train.py; --preempt-after N deletes the node at step N to prove the restart), so it proves
the production path; the delete sits in a `finally` that
SIGTERM and SIGHUP reach too, and the node carries a 2-hour TTL label for the janitor; `--dry-run`
prints every request and command and touches nothing (no credentials, bucket or VM). Credentials,
roles and the firewall: docs/google-cloud.md#smoke-test-on-real-hardware
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlm_tasks import credentials
from mlm_tasks.config import PipelineConfig, build_config, read_yaml_config
from mlm_tasks.errors import NO_RETRY_EXIT, ConfigError, NoRetryError, TransientError
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.smoke_train import TrainingFailed, follow_detached
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import job as vm_job
from mlm_tasks.tpu import slices as tpu_slices
from mlm_tasks.tpu import ssh
from mlm_tasks.training import restarts
from mlm_tasks.training.status import read_status

if TYPE_CHECKING:
    from google.cloud.tpu_v2 import TpuClient

DAG_ID = "mlm_smoke"


# The tests' smallest run, the same file (output_root and compute are the smoke test's own, below).
TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


API = "https://tpu.googleapis.com/v2"
log = logging.getLogger("mlm_tasks.smoke")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mlm_tasks.smoke", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--project", required=True, help="Google Cloud project.")
    p.add_argument(
        "--zone", required=True, help="Zone with capacity for the type (v5litepod: e.g. us-west4-a; v4: us-central2-b)."
    )
    p.add_argument("--bucket", required=True, help="gs://bucket/prefix for data, code and the run's artifacts.")
    p.add_argument(
        "--ssh-key",
        required=True,
        help="Private key file; its public half (KEY.pub) goes in the node's ssh-keys metadata.",
    )
    p.add_argument("--ssh-user", default="mlm", help="Login user on the VM (created from ssh-keys).")
    p.add_argument(
        "--accelerator",
        default="v5litepod-1",
        help="TPU type: any that validates (v5litepod-1, v4-8, "
        "or a pod slice such as v4-32 or v5litepod-16: see its request and remote line with --dry-run).",
    )
    p.add_argument(
        "--runtime",
        default=None,
        help="TPU runtime (default: the config's tpu.runtime_version, or its -pod twin for a multi-host type).",
    )
    p.add_argument(
        "--capture-image",
        action="store_true",
        help="Before the bootstrap, record the VM image's "
        "`pip freeze` into the runtime's image file (mlm_tasks/tpu/vm/image-tfX.Y.txt), so that the next "
        "`make lock-vm` locks against the real image.",
    )
    p.add_argument(
        "--provisioning",
        default="spot",
        choices=["on_demand", "spot", "queued"],
        help="How the node is asked for (tpu.provisioning): a Spot node (the default), an on-demand one, or a "
        "queued resource that waits in Google's queue for capacity (Spot tier; --set tpu.queued_tier=guaranteed).",
    )
    p.add_argument("--on-demand", action="store_true", help="The same as --provisioning on_demand.")
    p.add_argument("--ssh-via", default="external", choices=["external", "internal"])
    p.add_argument("--key-file", help="Service-account key JSON (default: Application Default Credentials).")
    p.add_argument("--run-id", default=None, help="Names the node and the run (default: smoke-<UTC time>).")
    p.add_argument("--data-fingerprint", help="Reuse the shards of an earlier smoke run instead of preparing.")
    p.add_argument(
        "--config",
        default=str(TINY_CONFIG),
        help="The run's settings (default: the checkout's "
        "configs/tiny.yaml); --bucket, --accelerator and the flags above override it.",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Any other setting.")
    p.add_argument("--dry-run", action="store_true", help="Print every request and command; send nothing.")
    p.add_argument(
        "--preempt-after",
        type=int,
        metavar="N",
        help="Delete the node once the trainer has recorded step N, as a preemption would: the tool replaces "
        "it and a new trainer resumes from the last checkpoint (proves the restart end to end).",
    )
    p.add_argument("--api-endpoint", help=argparse.SUPPRESS)  # tests: the fake TPU API
    p.add_argument("--timeout-s", type=float, default=1800, help="Give up waiting for READY after this long.")
    return p.parse_args(argv)


def smoke_config(args: argparse.Namespace) -> PipelineConfig:
    import yaml

    overrides = {
        "output_root": args.bucket,
        "compute": "tpu_vm",
        "tpu.project": args.project,
        "tpu.zone": args.zone,
        "tpu.accelerator_type": args.accelerator,
        "tpu.provisioning": "on_demand" if args.on_demand else args.provisioning,
        "tpu.ttl_hours": 2,
        "tpu.ssh_via": args.ssh_via,
        "tpu.poll_interval_s": 10,
        "tpu.create_timeout_s": int(args.timeout_s),
        "train.device": "tpu",
    }
    if args.runtime:
        overrides["tpu.runtime_version"] = args.runtime
    elif tpu_slices.hosts(args.accelerator) > 1:
        overrides["tpu.runtime_version"] = tpu_slices.pod_name(PipelineConfig().tpu.runtime_version)
    if args.api_endpoint:
        overrides.update({"tpu.api_endpoint": args.api_endpoint, "tpu.transport": "rest"})
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: use KEY=VALUE.")
        overrides[key] = yaml.safe_load(value)
    return build_config(read_yaml_config(args.config), overrides)


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


class Interrupted(BaseException):
    """SIGTERM/SIGHUP: unwinds like Ctrl-C, so the `finally` deletes the VM."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


def wait_ready(cfg: PipelineConfig, name: str, api: Any, deadline: float, out: Callable[[str], None]) -> tpu.NodeState:
    """The node once READY; with provisioning=queued its request waits in the queue first (no node yet)."""
    from mlm_tasks.tpu import queued

    state = tpu.get_state(cfg.tpu, name, api)
    while not state.ready:
        waiting = state.state in tpu.WAIT_STATES
        if cfg.tpu.provisioning == "queued" and state.state == tpu.NOT_FOUND:
            request = queued.get_state(cfg.tpu, name, api)
            waiting = request.state in queued.WAIT_STATES or request.state == "ACTIVE"
            state = replace(state, state=f"QUEUED ({request.state}{': ' + request.error if request.error else ''})")
        if not waiting:
            raise RuntimeError(
                f"TPU VM {name} is {state.state}: capacity or quota? Try another zone or --provisioning."
            )
        if time.time() > deadline:
            raise RuntimeError(f"TPU VM {name} not READY after {cfg.tpu.create_wait_s():g}s (still {state.state}).")
        out(f"TPU VM {name} is {state.state}; checking again in {cfg.tpu.poll_interval_s:g}s.")
        time.sleep(cfg.tpu.poll_interval_s)
        state = tpu.get_state(cfg.tpu, name, api)
    return state


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
        f"{time.strftime('%Y-%m-%d', time.gmtime())} by `python -m mlm_tasks.smoke --capture-image`: "
        f"Python {python}.\n" + "".join(f"# not from an index: {line}\n" for line in other) + "\n".join(pinned) + "\n"
    )
    out(
        f"Captured {len(pinned)} packages of {runtime.version} into {path}: run `make lock-vm`, "
        "then the tests, and commit both files."
    )
    return path


def smoke(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    cfg = smoke_config(args)
    run_id = args.run_id or time.strftime("smoke-%Y%m%dT%H%M%S", time.gmtime())
    name = tpu.node_name(DAG_ID, run_id)
    public = Path(args.ssh_key + ".pub").read_text().split()
    metadata = {"ssh-keys": f"{args.ssh_user}:{public[0]} {public[1]} {args.ssh_user}"}
    node_labels = tpu.labels(run_id, cfg.tpu.ttl_hours)
    if args.key_file and not args.dry_run:
        from google.oauth2 import service_account

        credentials.install(service_account.Credentials.from_service_account_file(args.key_file, scopes=[tpu.SCOPE]))
    # The dry run's stand-in answers every call ensure_node and delete_node make for an absent node.
    api = cast("TpuClient", DryRunApi(out)) if args.dry_run else tpu.client(cfg.tpu)
    out(
        f"Smoke run {run_id}: TPU VM {name} ({cfg.tpu.accelerator_type}, {cfg.tpu.runtime_version}, "
        f"{cfg.tpu.provisioning}) in {cfg.tpu.project}/{cfg.tpu.zone}, output {cfg.output_root}"
    )
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        fingerprint, code = _prepare(cfg, args, out)
        command = _train_line(cfg, run_id, name, fingerprint, code)
        if args.dry_run:
            tpu.ensure_node(cfg.tpu, name, node_labels, metadata, api=api)
            _worker_0(cfg, name, tpu.NodeState(name=name, state="READY"), args, out)
            ssh_line = f"ssh -p {cfg.tpu.ssh_port} -i {args.ssh_key} {args.ssh_user}@<worker-0-ip>"
            if args.capture_image:
                out(f"{ssh_line} {capture_command(cfg)}")
            out(f"{ssh_line} {command}")
            out(f"(dry run) would follow the detached trainer until done{_preempting(args)}")
            return 0
        node = ready_node(cfg, name, node_labels, metadata, api, out)
        if args.capture_image:
            hosts = _worker_0(cfg, name, node, args, out)
            capture_image(cfg, name, login_to(cfg, name, args, api), hosts[0], out)

        def start_on(ready: tpu.NodeState) -> tuple[TrainJob, ssh.Connect]:
            host = _worker_0(cfg, name, ready, args, out)[0]
            return start_detached(cfg, run_id, name, ready, host, login_to(cfg, name, args, api), command, out)

        taken = follow_detached(
            cfg,
            run_id,
            name,
            node,
            start_on=start_on,
            ready_node=lambda: ready_node(cfg, name, node_labels, metadata, api, out),
            out=out,
            preempt_after=args.preempt_after,
            api=api,
        )
        from mlm_tasks import storage

        run = RunPaths(cfg.output_root, run_id)
        summary, status = storage.read_json_if_exists(run.train_summary), read_status(run)
        steps = summary["steps"] if summary else status["step"] if status else "?"
        out(
            f"Smoke PASSED: {steps} steps on {cfg.tpu.accelerator_type} ({restarts.summary_line(taken)}), "
            f"summary in {run.train_summary}"
        )
        return 0
    except TrainingFailed as err:  # the trainer's own words; anything else propagates to main
        out(f"Smoke FAILED: {err}")
        return 1
    finally:
        # Always: whatever failed above, Ctrl-C, SIGTERM or SIGHUP. A failed delete is loud: the VM costs money.
        try:
            op = tpu.delete_node(cfg.tpu, name, api=api)
            out(f"Deleting TPU VM {name}: {op or 'already gone'}")
        except Exception as err:  # any failure recorded for the person, with what to run by hand; not raised, so
            # it does not hide the smoke's own error (the janitor's TTL is the last resort)
            out(
                f"DELETE OF TPU VM {name} FAILED ({err}): run `gcloud compute tpus tpu-vm delete {name} "
                f"--zone {cfg.tpu.zone} --project {cfg.tpu.project}` (its expires label is 2 hours out)."
            )
        for s, handler in previous.items():
            signal.signal(s, handler)


def _preempting(args: argparse.Namespace) -> str:
    return f", deleting the node at step {args.preempt_after} and restarting" if args.preempt_after else ""


def _train_line(cfg: PipelineConfig, run_id: str, name: str, fingerprint: str, code: Any) -> str:
    """The DAG's detached train line (one try: MLM_TRY_NUMBER=1, as the trainer's status record says)."""
    from mlm_tasks.tpu.bundle import remote_command

    return remote_command(
        cfg,
        "train",
        run_id,
        node=name,
        extra_args=["--data-fingerprint", fingerprint],
        code=code,
        env={"MLM_TRY_NUMBER": "1"},
        detach_log=vm_job.log_name(run_id, 1),
    )


def ready_node(
    cfg: PipelineConfig,
    name: str,
    node_labels: dict[str, str],
    metadata: dict[str, str],
    api: Any,
    out: Callable[[str], None],
) -> tpu.NodeState:
    """The node READY: created, queued, or a dead or deleted one replaced (ensure_node until it has
    started what it needs), then waited for."""
    deadline = time.time() + cfg.tpu.create_wait_s()
    state = tpu.ensure_node(cfg.tpu, name, node_labels, metadata, api=api)
    while state.action in ("wait", "recreating") and state.state in ("DELETING", tpu.NOT_FOUND):
        if time.time() > deadline:
            raise RuntimeError(f"TPU VM {name} still {state.state} after {cfg.tpu.create_wait_s():g}s.")
        out(f"TPU VM {name} is {state.state}; checking again in {cfg.tpu.poll_interval_s:g}s.")
        time.sleep(cfg.tpu.poll_interval_s)
        state = tpu.ensure_node(cfg.tpu, name, node_labels, metadata, api=api)
    return wait_ready(cfg, name, api, deadline, out)


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
    before = read_status(RunPaths(cfg.output_root, run_id))
    outcome, job = vm_job.start(
        ssh.Session(connect, host, on_line=lambda line: out(f"[worker 0] {line}")),
        command,
        secret=None,
        node=name,
        node_created=node.created,
        host=host,
        try_number=1,
        log=vm_job.log_name(run_id, 1),
        workdir=cfg.tpu.workdir,
        run_id=run_id,
        now=time.time(),
        starts_before=before["starts"] if before else 0,
    )
    if outcome.exit_code != 0 or job is None:
        raise TrainingFailed(outcome.describe())
    out(f"Trainer started detached: pid {job['pid']} on {name}; its log: {cfg.tpu.workdir}/{job['log']}")
    return job, connect


def _prepare(cfg: PipelineConfig, args: argparse.Namespace, out: Callable[[str], None]) -> tuple[str, Any]:
    """The tiny data set and the staged code (a dry run: their names and the real hashes, nothing sent)."""
    from mlm_tasks.tpu.bundle import code_bundle, stage_code

    if args.dry_run:
        fingerprint = args.data_fingerprint or "<fingerprint>"
        out(
            f"(dry run) would prepare the tiny data set under {cfg.output_root}/datasets/ and stage the code "
            f"under {cfg.output_root}/_code/"
        )
        code = code_bundle(cfg.output_root, cfg.tpu.runtime_version)[0]  # the real hashes, nothing sent
    else:
        from mlm_tasks.steps import build_shard_set

        fingerprint = args.data_fingerprint or build_shard_set(cfg)["fingerprint"]
        code = stage_code(cfg.output_root, cfg.tpu.runtime_version)
    return fingerprint, code


def _worker_0(
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return smoke(parse_args(argv), out=lambda line: print(line, flush=True))
    except NoRetryError as err:  # as the CLI: a bad input, a missing artifact, a refused credential
        print(f"error: {err}", file=sys.stderr)
        return NO_RETRY_EXIT
    except (RuntimeError, TransientError, Interrupted, KeyboardInterrupt) as err:
        print(f"Smoke FAILED: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
