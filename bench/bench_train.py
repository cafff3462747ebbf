"""Benchmark 5: training tokens/s, ours (mlm_tasks.steps.train, LM head at <= 32 masked positions per sequence)
against the plain reference loop (TFRobertaForMaskedLM.compile + model.fit, transformers.create_optimizer,
the full-vocabulary head at every position), tiny and small presets, XLA off and on; and loss per step.

    .venv/bin/python bench/bench_train.py [--presets tiny,small] [--xla off,on] [--precision off] [--rounds 3]
        [--device cpu] [--steps 60] [--warmup 10]      # on a GPU: --device gpu --presets tiny,base --precision off,bf16

Equal config: configs/default.yaml (vocab 8000, max_length 128, batch 32, dropout 0, lr 1e-3, AdamW via
create_optimizer with the same schedule), the same shards. The reference's input pipeline is the one of
Hugging Face's TF/TPU MLM example: TFRecordDataset -> parse -> shuffle -> batch -> in-graph masking with
DataCollatorForLanguageModeling.tf_mask_tokens -> prefetch. Each run is a fresh subprocess; tokens/s
counts steps after `warmup` (tracing/compilation excluded): ours from its history windows, the
reference from a per-batch timing callback. Loss equality: the same initial weights and the same 8
batches through both; the per-step losses are compared.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

BATCH = 32
REFERENCE_MLM_PROBABILITY = 0.15  # DataCollatorForLanguageModeling's, as the reference loop runs it


def _setup(preset: str, xla: str, steps: int, **settings):
    """(cfg, data summary, data paths, shard set) of one run; `settings`: those of `overrides`."""
    from mlm_tasks.data.shard_set import ShardSet
    from mlm_tasks.paths import DataPaths

    data = common.prepared()
    cfg = common.bench_config(**overrides(preset, xla, steps, **settings))
    paths = DataPaths(cfg.output_root, data["fingerprint"])
    return cfg, data, paths, ShardSet.load(paths)


def overrides(
    preset: str,
    xla: str,
    steps: int,
    max_pred: int = 32,
    log_every: int = 10,
    precision: str = "off",
    device: str = "cpu",
    batch: int = BATCH,
    extra: dict | None = None,
) -> dict:
    """The settings of one run over configs/default.yaml (`extra`: more of them): the reference's masking
    (15%, its collator's) at most `max_pred` positions a sequence (the default masks 30%, more than 32 of 128)."""
    return {
        "model.architecture": "roberta",  # the reference is TFRobertaForMaskedLM; the default's CPU run is ModernBERT
        "model.intermediate_size": None,
        "model.preset": preset,
        "train.xla": xla,
        "train.steps": steps,
        "train.log_every": log_every,
        "train.checkpoint_every": 10**6,
        "train.mlm_probability": REFERENCE_MLM_PROBABILITY,
        "train.max_predictions_per_seq": max_pred,
        "train.device": device,
        "train.mixed_precision": precision,
        "train.batch_size": batch,
        **(extra or {}),
    }


def run_ours(preset: str, xla: str, steps: int, warmup: int, precision: str, device: str) -> dict:
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.train import train

    cfg, data, _, _ = _setup(preset, xla, steps, log_every=warmup, precision=precision, device=device)
    run_id = f"bench-{preset}-{xla}-{os.getpid()}-{int(time.time())}"
    summary = train(cfg, RunContext.of(cfg, run_id, data["fingerprint"]))
    from mlm_tasks.paths import RunPaths
    from mlm_tasks.training.progress import read_history

    history = [h for h in read_history(RunPaths(cfg.output_root, run_id)) if h["step"] > warmup]
    tokens = warmup * BATCH * common.MAX_LENGTH * len(history)
    seconds = sum(warmup * BATCH * common.MAX_LENGTH / h["tokens_per_s"] for h in history)
    return {"tokens_per_s": tokens / seconds, "steps_timed": warmup * len(history), "last_loss": summary["last_loss"]}


def reference_dataset(paths, manifest, tokenizer, seed: int = 42, batch: int = BATCH):
    """The HF TF/TPU MLM example's pipeline over our shards (input_ids and attention_mask, as it parses them)."""
    import tensorflow as tf
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm_probability=REFERENCE_MLM_PROBABILITY, return_tensors="tf"
    )
    feature = {k: tf.io.FixedLenFeature([manifest.max_length], tf.int64) for k in ("input_ids", "attention_mask")}

    def decode(serialized):
        return tf.io.parse_single_example(serialized, feature)

    def mask(batch):
        special = tf.cast(
            tf.reduce_any(
                batch["input_ids"][..., None] == tf.constant(tokenizer.all_special_ids, dtype=tf.int64), axis=-1
            ),
            tf.bool,
        )
        ids, labels = collator.tf_mask_tokens(
            batch["input_ids"],
            vocab_size=len(tokenizer),
            mask_token_id=tokenizer.mask_token_id,
            special_tokens_mask=special,
        )
        return {"input_ids": ids, "attention_mask": batch["attention_mask"], "labels": labels}

    ds = tf.data.TFRecordDataset(manifest.shard_uris("train")).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.shuffle(10_000, seed=seed).repeat().batch(batch, drop_remainder=True)
    return ds.map(mask, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _reference_model(cfg, data, manifest, steps: int, xla: bool):
    from transformers import create_optimizer

    from mlm_tasks.model.roberta import build_model, model_config

    model = build_model(model_config(cfg, data["vocab_size"], manifest.special_ids))
    optimizer, _ = create_optimizer(
        init_lr=cfg.train.learning_rate,
        num_train_steps=steps,
        num_warmup_steps=int(steps * cfg.train.warmup_fraction),
        weight_decay_rate=cfg.train.weight_decay,
    )
    # As the reference (train_model.py) compiles it: the model's own MLM loss, and an accuracy metric
    # (ours reports masked-token accuracy every step too).
    model.compile(optimizer=optimizer, metrics=["accuracy"], jit_compile=xla)
    return model


def run_reference(preset: str, xla: str, steps: int, warmup: int, precision: str, device: str) -> dict:
    cfg, data, paths, manifest = _setup(preset, xla, steps, precision=precision, device=device)
    return fit_reference(cfg, data, paths, manifest, precision, warmup)[0]


def fit_reference(cfg, data, paths, manifest, precision: str, warmup: int):
    """The reference loop for cfg's steps, batch size and XLA setting; (its tokens/s over the steps after
    `warmup`, the model)."""
    import tensorflow as tf
    import tf_keras

    from mlm_tasks.data.tokenizer import load_tokenizer

    tf.keras.utils.set_random_seed(cfg.train.seed)
    if precision == "bf16":  # as train_model.py's --bfloat16 does
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tokenizer = load_tokenizer(data["tokenizer_uri"], manifest.max_length)
    steps, batch = cfg.train.steps, cfg.train.batch_size
    model = _reference_model(cfg, data, manifest, steps, cfg.train.xla == "on")
    timer = _timer(marks_at=(warmup, steps))
    history = model.fit(
        reference_dataset(paths, manifest, tokenizer, batch=batch),
        steps_per_epoch=steps,
        epochs=1,
        callbacks=[timer],
        verbose=0,
    )
    seconds = timer.marks[steps] - timer.marks[warmup]
    return {
        "tokens_per_s": (steps - warmup) * batch * manifest.max_length / seconds,
        "steps_timed": steps - warmup,
        "last_loss": float(history.history["loss"][-1]),
    }, model


def _timer(marks_at: tuple[int, ...]):
    """A fit callback noting the time at which steps `marks_at` (1-based) have finished. It waits for the
    device at those steps only: a callback that takes numpy logs (LambdaCallback) makes fit wait after
    every step, which on a GPU would slow the reference it times."""
    import tf_keras

    class Timer(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # logs stay tensors: no wait per step
            self.marks: dict[int, float] = {}

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in marks_at:
                float(logs["loss"])  # waits for this step's result
                self.marks[batch + 1] = time.perf_counter()

    return Timer()


def run_equality(preset: str, n: int = 8) -> dict:
    """Same weights, same n batches: per-step losses of ours (masked positions only) and the reference fit."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from transformers import create_optimizer

    from mlm_tasks.data.input import mlm_dataset
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.model.roberta import masked_lm_loss

    cfg, data, paths, manifest = _setup(preset, "off", n)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    tokenizer = load_tokenizer(data["tokenizer_uri"], common.MAX_LENGTH)
    batches = list(mlm_dataset(manifest, "train", tokenizer, BATCH, seed=1).take(n).as_numpy_iterator())
    ref = _reference_model(cfg, data, manifest, n, False)
    ours = _reference_model(cfg, data, manifest, n, False)
    ours.set_weights(ref.get_weights())
    optimizer, _ = create_optimizer(
        init_lr=cfg.train.learning_rate,
        num_train_steps=n,
        num_warmup_steps=int(n * cfg.train.warmup_fraction),
        weight_decay_rate=cfg.train.weight_decay,
    )

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss_sum, count, _ = masked_lm_loss(ours, batch, cfg.train.max_predictions_per_seq, training=True)
            loss = loss_sum / tf.maximum(count, 1.0)
        grads = tape.gradient(loss, ours.trainable_variables)
        optimizer.apply_gradients(zip(grads, ours.trainable_variables, strict=False))
        return loss

    ours_losses = [float(step(b)) for b in batches]
    running: list[float] = []
    cb = tf_keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: running.append(logs["loss"]))
    ds = tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature={
            k: tf.TensorSpec((BATCH, common.MAX_LENGTH), tf.int32 if v.dtype == np.int32 else tf.int64)
            for k, v in batches[0].items()
        },
    )
    ref.fit(ds, epochs=1, callbacks=[cb], verbose=0)
    # Keras logs the running mean over the epoch: undo it to get each step's loss.
    ref_losses = [running[0]] + [(k + 1) * running[k] - k * running[k - 1] for k in range(1, len(running))]
    overflow = sum(int(((b["labels"] != -100).sum(axis=1) > cfg.train.max_predictions_per_seq).sum()) for b in batches)
    return {"ours": ours_losses, "reference": ref_losses, "sequences_over_max_predictions": overflow}


def worker(arg: str) -> None:
    kind, *rest = arg.split(":")
    if kind == "equality":
        return common.emit(run_equality(rest[0]))
    preset, xla, precision, device, steps, warmup = rest[0], rest[1], rest[2], rest[3], int(rest[4]), int(rest[5])
    fn = run_ours if kind == "ours" else run_reference
    common.emit(fn(preset, xla, steps, warmup, precision, device))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--xla", default="off,on")
    p.add_argument("--steps", type=int, default=60, help="steps per run for tiny (small: half)")
    p.add_argument("--warmup", type=int, default=10, help="steps not timed (small: half)")
    p.add_argument("--precision", default="off", help="off and/or bf16 (mixed precision), comma-separated")
    p.add_argument("--device", default="cpu", help="cpu, gpu or auto (train.device)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds per config; medians reported")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    common.prepared()
    rows = []
    for preset in args.presets.split(","):
        steps, warmup = (args.steps, args.warmup) if preset == "tiny" else (args.steps // 2, args.warmup // 2)
        for xla, precision in [(x, m) for x in args.xla.split(",") for m in args.precision.split(",")]:
            res: dict[str, list[dict]] = {"ours": [], "reference": []}
            for rnd in range(args.rounds):  # alternate which goes first, so drift hits both alike
                for impl in ("ours", "reference") if rnd % 2 == 0 else ("reference", "ours"):
                    res[impl].append(
                        common.run_worker(__file__, f"{impl}:{preset}:{xla}:{precision}:{args.device}:{steps}:{warmup}")
                    )
                    print(
                        f"{preset} xla={xla} precision={precision} {impl}: "
                        f"{res[impl][-1]['tokens_per_s']:.0f} tokens/s",
                        file=sys.stderr,
                    )
            o = common.median([x["tokens_per_s"] for x in res["ours"]])
            r = common.median([x["tokens_per_s"] for x in res["reference"]])
            rounds = " ".join(
                f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}"
                for a, b in zip(res["ours"], res["reference"], strict=False)
            )
            rows.append(
                [
                    preset,
                    xla,
                    precision,
                    r,
                    o,
                    o / r,
                    rounds,
                    f"{res['ours'][0]['steps_timed']}/{res['reference'][0]['steps_timed']}",
                    res["reference"][0]["peak_rss_mb"],
                    res["ours"][0]["peak_rss_mb"],
                ]
            )
    eq = common.run_worker(__file__, "equality:tiny")
    print(f"\n{common.machine()}\nbatch {BATCH} x {common.MAX_LENGTH} tokens, vocab 8000; tokens/s after warmup\n")
    print(f"median of {args.rounds} alternating round(s)\n")
    print(
        common.table(
            [
                "preset",
                "XLA",
                "precision",
                "reference tokens/s",
                "ours tokens/s",
                "ours / reference",
                "per-round ratios",
                "steps timed (ours/ref)",
                "ref peak RSS MB",
                "ours peak RSS MB",
            ],
            rows,
        )
    )
    print(
        f"\nloss per step, tiny, same initial weights and batches ({eq['sequences_over_max_predictions']} "
        "sequences had more than 32 masked tokens):\n"
    )
    print(
        common.table(
            ["step", "reference", "ours", "|diff|"],
            [
                [i + 1, f"{r:.6f}", f"{o:.6f}", f"{abs(r - o):.1e}"]
                for i, (r, o) in enumerate(zip(eq["reference"], eq["ours"], strict=False))
            ],
        )
    )
    print("\ntarget: ours >= 2x the reference at equal config, equal loss per step")


if __name__ == "__main__":
    main()
