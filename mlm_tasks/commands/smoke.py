r"""Real-cloud smoke test: one tiny training on a real TPU VM, then the VM is deleted, whatever happens.

    python -m mlm_tasks.commands.smoke --project my-project --zone us-west4-a --bucket gs://my-bucket/smoke \
        --ssh-key ~/.ssh/id_ed25519 [--accelerator v5litepod-1] [--provisioning queued] [--dry-run] [--capture-image]

It sends the DAG's own TPU VM request, runs the real bootstrap and trainer on worker 0 and makes the DAG's
own decisions (smoke_train.py), so it proves the production path; the delete sits in a `finally` that
SIGTERM and SIGHUP reach too. `--dry-run` prints every request and command and touches nothing.
Credentials, roles and the firewall: docs/google-cloud.md#smoke-test-on-real-hardware
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlm_tasks import credentials, storage
from mlm_tasks.commands.smoke_train import SmokeDriver, TrainingFailed
from mlm_tasks.commands.smoke_vm import DryRunApi, capture_command, capture_image, login_to, start_detached, worker_0
from mlm_tasks.config import PipelineConfig, build_config, read_yaml_config
from mlm_tasks.errors import NO_RETRY_EXIT, ConfigError, NoRetryError, TransientError
from mlm_tasks.job import launch as vm_job
from mlm_tasks.job import restarts
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import slices as tpu_slices
from mlm_tasks.tpu import ssh
from mlm_tasks.tpu.bundle import code_bundle, remote_command, ssh_command, stage_code

if TYPE_CHECKING:
    from google.cloud.tpu_v2 import TpuClient

DAG_ID = "mlm_smoke"
TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"  # the tests' smallest run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mlm_tasks.commands.smoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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


class Interrupted(BaseException):
    """SIGTERM/SIGHUP: unwinds like Ctrl-C, so the `finally` deletes the VM."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


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
        command = _train_line(cfg, args, run_id, name, out)
        if args.dry_run:
            tpu.ensure_node(cfg.tpu, name, node_labels, metadata, api=api)
            worker_0(cfg, name, tpu.NodeState(name=name, state="READY"), args, out)
            login = f"{args.ssh_user}@<worker-0-ip>"  # quoted: a bare <...> is a shell redirect
            if args.capture_image:
                out(ssh_command(cfg.tpu.ssh_port, args.ssh_key, login, capture_command(cfg)))
            out(ssh_command(cfg.tpu.ssh_port, args.ssh_key, login, command))
            after = args.preempt_after
            preempting = f", deleting the node at step {after} and restarting" if after else ""
            out(f"(dry run) would follow the detached trainer until done{preempting}")
            return 0
        captured: list[Path] = []

        def start_on(ready: tpu.NodeState) -> tuple[TrainJob, ssh.Connect]:
            host = worker_0(cfg, name, ready, args, out)[0]
            connect = login_to(cfg, name, args, api)
            if args.capture_image and not captured:  # before the bootstrap installs anything
                captured.append(capture_image(cfg, name, connect, host, out))
            return start_detached(cfg, run_id, name, ready, host, connect, command, out)

        taken = SmokeDriver(
            cfg,
            run_id,
            name,
            api=api,
            ensure=lambda: tpu.ensure_node(cfg.tpu, name, node_labels, metadata, api=api),
            start_on=start_on,
            out=out,
            preempt_after=args.preempt_after,
        ).run()
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
        except Exception as err:  # said with what to run by hand, not raised: the smoke's own error goes first
            out(
                f"DELETE OF TPU VM {name} FAILED ({err}): run `gcloud compute tpus tpu-vm delete {name} "
                f"--zone {cfg.tpu.zone} --project {cfg.tpu.project}` (its expires label is 2 hours out)."
            )
        for s, handler in previous.items():
            signal.signal(s, handler)


def _train_line(
    cfg: PipelineConfig, args: argparse.Namespace, run_id: str, name: str, out: Callable[[str], None]
) -> str:
    """The DAG's detached train line (one try: MLM_TRY_NUMBER=1, as the trainer's status record says), once the
    tiny data set and the code are staged (a dry run: their names and the real hashes, nothing sent)."""
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
