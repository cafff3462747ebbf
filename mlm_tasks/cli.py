"""Command line for every step: each verb is the step function of the same name in mlm_tasks/steps/.

    python -m mlm_tasks validate        --config configs/default.yaml [--set train.steps=100 ...]
    python -m mlm_tasks build_shard_set --config configs/default.yaml    # plan, write, merge in one process
    python -m mlm_tasks train           --config configs/default.yaml --run-id r1 [--data-fingerprint FP]
    python -m mlm_tasks run_all         --config configs/tiny.yaml --run-id r1   # every step to the gate, no Airflow

Exit status 2: an error no retry can fix (NoRetryError); 1: anything else. docs/configuration.md#the-command-line"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys

import yaml

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig, build_config, load_config
from mlm_tasks.errors import NO_RETRY_EXIT, AuthError, ConfigError, NoRetryError
from mlm_tasks.job import preemption
from mlm_tasks.paths import RunContext, safe_run_id
from mlm_tasks.steps import SHARD_SET_STEPS, STEPS

# The pipeline's steps (mlm_tasks/steps/, the DAGs' task ids) and four conveniences.
VERBS = (*STEPS, "fingerprint", "build_shard_set", "run_all", "compare")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mlm_tasks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("step", choices=VERBS, metavar="step", help="One of: " + ", ".join(VERBS))
    p.add_argument("--config", help="YAML config file (see configs/).")
    p.add_argument("--config-json", help="The whole config as JSON (overrides --config).")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Flat or dotted KEY; VALUE is YAML.")
    p.add_argument("--run-id", default="cli-run", help="Run id: keys the run's artifacts.")
    p.add_argument("--data-fingerprint", help="Use the shard set with this fingerprint.")
    p.add_argument("--hub-token-stdin", action="store_true", help="Read the Hub token from stdin, not HF_TOKEN.")
    p.add_argument("--part", type=int, default=0, help="scan_partition, write_shards: which partition (0-based).")
    p.add_argument("--bucket", type=int, default=0, help="find_duplicates: which bucket (0-based).")
    p.add_argument("--runs", default="", help="compare: run ids, comma-separated (default: every trained run).")
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> PipelineConfig:
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: use KEY=VALUE, e.g. --set train.steps=100.")
        overrides[key] = yaml.safe_load(value)
    if args.config_json:
        return build_config(json.loads(args.config_json), overrides)
    return load_config(args.config, overrides)


# Steps that read a shard set: without --data-fingerprint, its fingerprint is computed from the corpus.
NEEDS_DATA = (*SHARD_SET_STEPS[1:], "check_run", "train", "evaluate", "publish_tokenizer", "summary")


def run_step(step: str, cfg: PipelineConfig, ctx: RunContext, part: int = 0, runs: str = "", bucket: int = 0) -> object:
    """One verb: the step function of the same name (mlm_tasks/steps/<step>.py) with this process's inputs."""
    from mlm_tasks import steps
    from mlm_tasks.data.shard_set import data_fingerprint, summary_for_fingerprint

    if step == "fingerprint":
        return data_fingerprint(cfg)
    if step == "compare":
        from mlm_tasks.reporting.compare import compare_runs, write_comparison

        chosen = [safe_run_id(r) for r in runs.split(",") if r] or None  # run ids or folder names; none: every run
        return write_comparison(cfg.output_root, compare_runs(cfg.output_root, chosen))
    if step == "build_shard_set":
        return steps.build_shard_set(cfg, ctx)
    if step == "run_all":
        return steps.run_all(cfg, ctx, hub_token=_hub_token(needed=cfg.publish.sync_checkpoints))
    if step in NEEDS_DATA and not ctx.fingerprint:
        ctx = ctx.with_data(data_fingerprint(cfg))
    kwargs: dict = {}
    if step == "check_run":
        kwargs = {"data": summary_for_fingerprint(cfg, ctx.data.fingerprint)}
    elif step in ("scan_partition", "write_shards"):
        kwargs = {"part": part, "num_parts": cfg.shards.partitions}
    elif step == "find_duplicates":
        kwargs = {"bucket": bucket, "num_parts": cfg.shards.partitions}
    elif step in ("cluster_duplicates", "train_tokenizer"):
        kwargs = {"num_parts": cfg.shards.partitions}
    elif step == "train":
        kwargs = {"hub_token": _hub_token(needed=cfg.publish.sync_checkpoints)}
    elif step in ("publish", "publish_tokenizer"):
        kwargs = {"token": _hub_token(needed=True)}
    func = getattr(importlib.import_module(f"mlm_tasks.steps.{step}"), step)
    return func(cfg) if step == "validate" else func(cfg, ctx, **kwargs)


_stdin_token: str | None = None  # --hub-token-stdin: read once in main(), before any step runs


def _hub_token(needed: bool) -> str | None:
    """The first line of stdin with --hub-token-stdin, else HF_TOKEN; passed on to the step as an argument."""
    token = _stdin_token or os.environ.get("HF_TOKEN")
    if needed and not token:
        raise AuthError(
            "This step talks to the Hugging Face Hub (publish, or publish.sync_checkpoints): set "
            "HF_TOKEN to a token with write access, or turn publishing off."
        )
    return token


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.hub_token_stdin:
        global _stdin_token
        _stdin_token = sys.stdin.readline().strip() or None
    try:
        cfg = resolve_config(args)
        storage.set_timeout(cfg.storage.timeout_s)
        for name, value in storage.tensorflow_env().items():  # before TensorFlow's first gs:// call
            os.environ.setdefault(name, value)
        # A trainer of its own (a TPU VM's, a shell's): SIGTERM is a preemption notice, answered with a checkpoint.
        with preemption.notice_on_sigterm() if args.step == "train" else contextlib.nullcontext():
            ctx = RunContext.of(cfg, args.run_id, args.data_fingerprint)
            result = run_step(args.step, cfg, ctx, args.part, args.runs, args.bucket)
    except NoRetryError as err:
        print(f"error: {err}", file=sys.stderr)
        return NO_RETRY_EXIT
    except preemption.Preempted as err:
        print(f"preempted: {err}", file=sys.stderr)
        return preemption.PREEMPTED_EXIT
    # One line unless a terminal: the train task shows a TPU VM trainer log's last lines, which indenting would fill.
    print(json.dumps(result, indent=2 if sys.stdout.isatty() else None))
    return 0
