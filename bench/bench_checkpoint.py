"""Benchmark: how long a checkpoint of roberta-base takes to save on this CPU, the one a preemption
notice asks for (mlm_tasks/job/preemption.py).

    .venv/bin/python bench/bench_checkpoint.py [--preset base] [--rounds 3] [--dir /tmp/mlm-bench/ckpt]

The model the pipeline builds for `model.preset` (50,265-token vocabulary, as roberta-base) and its
AdamW optimizer with its slots made (one step of zero gradients), saved through the same
tf.train.CheckpointManager the trainer uses (`mlm_tasks/training/state.py`), to a local folder:
sync (what the trainer does today: training waits for it) and async
(`CheckpointOptions(experimental_enable_async_checkpoint=True)`: training waits only for the copy to
host memory, the write goes on in a thread). A Spot VM's shutdown gives 30 s between SIGTERM and
SIGKILL; the table says what of it one save takes. A gs:// bucket adds its upload time on a VM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


def _model_and_optimizer(preset: str):
    import tensorflow as tf

    from mlm_tasks.config import load_config
    from mlm_tasks.model.roberta import build_model, model_config, optimizer_and_schedule

    # Not the bench config: configs/default.yaml trims the preset's layers; this is the preset's own shape.
    cfg = load_config(None, {"model.preset": preset, "tokenizer.vocab_size": 50265})
    config = model_config(cfg, 50265, {"pad": 1, "bos": 0, "eos": 2})
    model = build_model(config)
    optimizer, _ = optimizer_and_schedule(cfg.train, 1000)
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])  # make the slots
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    return tf.train.Checkpoint(model=model, optimizer=optimizer, step=step), model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="base")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(common.BENCH_ROOT, "ckpt"))
    args = p.parse_args()
    import tensorflow as tf

    checkpoint, model = _model_and_optimizer(args.preset)
    params = sum(int(tf.size(v)) for v in model.trainable_variables)
    rows = []
    for mode in ("sync", "async"):
        options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=mode == "async")
        for rnd in range(args.rounds):
            folder = os.path.join(args.dir, f"{mode}-{rnd}")
            shutil.rmtree(folder, ignore_errors=True)
            manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=2)
            began = time.perf_counter()
            manager.save(checkpoint_number=rnd + 1, options=options)
            returned = time.perf_counter() - began
            if mode == "async":
                checkpoint.sync()  # the write itself, done
            written = time.perf_counter() - began
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
            rows.append([mode, rnd + 1, f"{params / 1e6:.1f} M", f"{size / 2**20:,.0f} MiB", returned, written])
            print(
                f"{mode} round {rnd + 1}: training waited {returned:.2f}s, written in {written:.2f}s", file=sys.stderr
            )
    print(f"\nCheckpoint save, model.preset={args.preset} + AdamW slots, to {args.dir}; {common.machine()}\n")
    print(common.table(["mode", "round", "parameters", "on disk", "training waits s", "written after s"], rows))


if __name__ == "__main__":
    main()
