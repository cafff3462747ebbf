"""Benchmark 4: the input pipeline's ceiling (no model) against what the tiny model consumes.

    .venv/bin/python bench/bench_input.py [--batches 300] [--train-steps 40]

Input: mlm_tasks.data.input.mlm_dataset over the embedded train shards (read, parse, shuffle, batch 32,
in-graph masking, prefetch), batches/s after 20 warm-up batches. Consumption: steps/s of
mlm_tasks.steps.train (tiny preset, configs/default.yaml) after its first log window, in a fresh
subprocess. Target: input batches/s >= 10x training steps/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from bench_train import BATCH, run_ours


def input_rate(batches: int) -> float:
    from mlm_tasks.data.input import mlm_dataset
    from mlm_tasks.data.shard_set import ShardSet
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.paths import DataPaths

    data = common.prepared()
    paths = DataPaths(common.BENCH_ROOT, data["fingerprint"])
    tokenizer = load_tokenizer(data["tokenizer_uri"], common.MAX_LENGTH)
    it = iter(mlm_dataset(ShardSet.load(paths), "train", tokenizer, BATCH))
    for _ in range(20):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)["input_ids"].numpy()
    return batches / (time.perf_counter() - t0)


def worker(arg: str) -> None:
    kind, n = arg.split(":")
    if kind == "input":
        return common.emit({"batches_per_s": input_rate(int(n))})
    res = run_ours("tiny", "off", int(n), 10)
    common.emit({"steps_per_s": res["tokens_per_s"] / (BATCH * common.MAX_LENGTH), **res})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--train-steps", type=int, default=40)
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    common.prepared()
    inp = common.run_worker(__file__, f"input:{args.batches}")
    train = common.run_worker(__file__, f"train:{args.train_steps}")
    print(f"\n{common.machine()}\n")
    print(
        common.table(
            ["input pipeline batches/s", "tiny model steps/s (ours, XLA off)", "ratio", "target"],
            [[inp["batches_per_s"], train["steps_per_s"], inp["batches_per_s"] / train["steps_per_s"], ">= 10"]],
        )
    )


if __name__ == "__main__":
    main()
