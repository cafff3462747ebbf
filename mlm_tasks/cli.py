"""Command line for every step, the same functions the DAG calls.

    python -m mlm_tasks validate      --config configs/default.yaml [--set train.steps=100 ...]
    python -m mlm_tasks prepare-data  --config configs/default.yaml
    python -m mlm_tasks plan-data     --config c.yaml --set shards.partitions=4   # the DAG's fan-out, by hand:
    python -m mlm_tasks write-partition --config c.yaml --set shards.partitions=4 --part 0   # (any machine)
    python -m mlm_tasks finish-data   --config c.yaml --set shards.partitions=4   # merge: manifest, _SUCCESS
    python -m mlm_tasks train         --config configs/default.yaml --run-id r1 [--data-fingerprint FP]
    python -m mlm_tasks evaluate|infer --config configs/default.yaml --run-id r1
    python -m mlm_tasks run-all       --config configs/tiny.yaml --run-id r1   # every step, no Airflow

`--config-json` takes the whole validated config as JSON (how a TPU VM receives the run's config).
Without --data-fingerprint, the fingerprint is computed from the corpus (needs the corpus at hand).
`train` with publish.sync_checkpoints uploads checkpoints with the Hub token in HF_TOKEN.
Exit status: 0 done, 2 bad configuration (fix the input), 1 anything else.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import yaml

from mlm_tasks.config import ConfigError, PipelineConfig, build_config, load_config

STEPS = ("validate", "fingerprint", "prepare-data", "plan-data", "write-partition", "finish-data", "train",
         "evaluate", "infer", "run-all")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mlm_tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=STEPS)
    p.add_argument("--config", help="YAML config file (see configs/).")
    p.add_argument("--config-json", help="The whole config as JSON (overrides --config).")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="Override a setting: a flat param name or a dotted path; VALUE is parsed as YAML.")
    p.add_argument("--run-id", default="cli-run", help="Run id: keys the run's artifacts.")
    p.add_argument("--data-fingerprint", help="Use the shard set with this fingerprint.")
    p.add_argument("--part", type=int, default=0, help="write-partition: which partition (0-based) of "
                   "shards.partitions to write.")
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


def run_step(step: str, cfg: PipelineConfig, run_id: str, fingerprint: str | None, part: int = 0) -> object:
    from mlm_tasks import prepare
    from mlm_tasks.prepare import data_fingerprint, prepare_data

    if step == "validate":
        from mlm_tasks.validate import validate_inputs

        validate_inputs(cfg)
        return cfg.model_dump(mode="json")
    if step == "fingerprint":
        return data_fingerprint(cfg)
    if step == "prepare-data":
        return prepare_data(cfg)
    if step == "plan-data":
        return prepare.plan_data(cfg, fingerprint)
    fingerprint = fingerprint or data_fingerprint(cfg)
    if step == "write-partition":
        return prepare.write_data_partition(cfg, fingerprint, part, cfg.shards.partitions)
    if step == "finish-data":
        return prepare.finish_data(cfg, fingerprint)
    if step == "train":
        from mlm_tasks.train import train

        # The one place mlm_tasks reads the Hub token from the environment (a TPU VM's remote line
        # exports it there from the SSH session); the step itself takes it as an argument.
        return train(cfg, run_id, fingerprint, hub_token=os.environ.get("HF_TOKEN") or None)
    if step == "evaluate":
        from mlm_tasks.evaluate import evaluate

        return evaluate(cfg, run_id, fingerprint)
    if step == "infer":
        from mlm_tasks.infer import fill_mask

        return fill_mask(cfg, run_id)
    raise ValueError(step)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        cfg = resolve_config(args)
        if args.step == "run-all":
            data = run_step("prepare-data", cfg, args.run_id, None)
            result = {"data": data}
            for step in ("train", "evaluate", "infer"):
                result[step] = run_step(step, cfg, args.run_id, data["fingerprint"])
        else:
            result = run_step(args.step, cfg, args.run_id, args.data_fingerprint, args.part)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str))
    return 0
