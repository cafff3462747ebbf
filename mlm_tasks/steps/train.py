"""Step train: train the masked LM, resumably, on CPU, GPU or TPU with the same code.

    python -m mlm_tasks train --config configs/default.yaml --run-id my-run --data-fingerprint FP

Four parts, each handing a typed result to the next: **plan** (mlm_tasks/training/plan.py: the
device, precision and strategy, the batch, the step count and the time budget), **build**
(mlm_tasks/training/state.py: model, optimizer, checkpoints, restored or from the base's weights),
**loop** (mlm_tasks/training/loop.py: the steps, with hooks, mlm_tasks/training/hooks.py) and
**finish** (here: the model saved, the summary written last).

The model is built inside the strategy's scope (TPUStrategy on a TPU VM, Mirrored on several GPUs,
the default strategy on CPU; `train.strategy=mirrored` runs the TPU's strategy.run path on one CPU).
A checkpoint (weights, optimizer moments, step; the learning-rate schedule follows the optimizer's
step) is written every `checkpoint_every` steps; a rerun of the same run restores the latest one and
skips the batches it already consumed, so a killed process loses at most one checkpoint interval and
finishes at exactly the configured step count.

With `model.init_from` the model is the base's (its config.json, the run's dropout) and starts from its
weights (mlm_tasks/model/init_weights.py), read at the revision the shard set recorded; warmup and
learning rate are the run's own. A resumed run restores its checkpoint instead.
"""

from __future__ import annotations

import logging
import platform
import tempfile
from collections.abc import Callable, Sequence

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import TrainSummary
from mlm_tasks.training.hooks import CheckpointCallback, TrainHook, hooks_from_env
from mlm_tasks.training.loop import TrainLoop
from mlm_tasks.training.plan import TrainInputs, TrainPlan, load_inputs, plan_training
from mlm_tasks.training.progress import best_so_far
from mlm_tasks.training.state import TrainState, build_training

log = logging.getLogger(__name__)


def train(
    cfg: PipelineConfig,
    ctx: RunContext,
    *,
    on_checkpoint: Callable[[int, str], None] | None = None,
    hub_token: str | None = None,
    hub_endpoint: str | None = None,
    hooks: Sequence[TrainHook] = (),
) -> TrainSummary:
    """Train (or resume) run `ctx.run_id` on the shard set `ctx.fingerprint`; returns the training
    summary (also written to the run's folder).

    `on_checkpoint(step, path)` is called after each saved checkpoint (`path`: its prefix, e.g.
    .../checkpoints/ckpt-40) and at the end with the final one; a hook with an int `checkpoint_every`
    attribute also gets a checkpoint saved every that many steps. With `publish.sync_checkpoints`, train
    adds the Hub sync hook of `mlm_tasks.hub.sync`, which uploads with `hub_token` to `hub_endpoint`
    (None: HF_ENDPOINT or huggingface.co). `hooks` (TrainHook, mlm_tasks/training/hooks.py) run
    around the loop, after those and before the ones MLM_TRAIN_HOOKS names (a test and diagnostic seam).
    """
    from mlm_tasks.hub import sync as hub_sync

    hub_sync.check_sync_settings(cfg, hub_token)  # a missing token fails now, not after the data checks
    hooks = [*hooks, *hooks_from_env()]  # a bad MLM_TRAIN_HOOKS fails now too
    inputs = load_inputs(cfg, ctx)
    if storage.exists(ctx.run.train_summary):
        done: TrainSummary = storage.read_json(ctx.run.train_summary)
        log.info("Run %s already finished training (%d steps): nothing to do", ctx.run_id, done["steps"])
        return done
    plan = plan_training(cfg, ctx.run, inputs)
    # None unless publish.sync_checkpoints (and on worker 0)
    sync = hub_sync.hub_checkpoint_sync(
        cfg,
        hub_token,
        train_records=inputs.shard_set.records("train"),
        global_batch=plan.global_batch,
        total_steps=plan.total_steps,
        strategy=plan.strategy,
        endpoint=hub_endpoint,
    )
    # The sync first (finish: the final upload): a caller's on_checkpoint then sees a checkpoint already queued.
    callbacks = [
        *([CheckpointCallback(sync, end=sync.finish)] if sync else []),
        *([CheckpointCallback(on_checkpoint)] if on_checkpoint else []),
    ]
    state = build_training(cfg, ctx.run, inputs, plan)
    if sync:  # each synced step is also a loadable model, the revision step-N
        sync.save_model = lambda folder: _save_model(state.model, inputs.tokenizer, folder)
    loop = TrainLoop(cfg, ctx.run, inputs, plan, state, [*callbacks, *hooks])
    with loop.status:  # runs/<run>/train/status.json: heartbeats while this runs, then done or failed
        loop.run()
        summary = _finish(cfg, ctx, inputs, plan, state, loop)
    cost_text = f", ${summary['cost_usd']:,.2f}" if summary["cost_usd"] is not None else ""
    log.info(
        "Training done: %d steps in %.0fs (%.0f tokens/s, %s%s), loss %.3f -> %.3f; model at %s",
        loop.total,
        summary["elapsed_s"],
        summary["tokens_per_s"] or 0,
        summary["mfu_of"],
        cost_text,
        summary["first_loss"] or float("nan"),
        summary["last_loss"] or float("nan"),
        ctx.run.model,
    )
    return summary


def _finish(
    cfg: PipelineConfig, ctx: RunContext, inputs: TrainInputs, plan: TrainPlan, state: TrainState, loop: TrainLoop
) -> TrainSummary:
    """After the final checkpoint: the kept step's weights (train.keep_checkpoint) saved as the model, then
    the summary, written last (it marks training complete)."""
    best = best_so_far(state.history)
    if cfg.train.keep_checkpoint == "best" and best is not None and best[0] != loop.total:
        import tensorflow as tf

        # After the final checkpoint (a resume must continue from the last step, not the best).
        tf.train.Checkpoint(model=state.model).restore(join(ctx.run.train_best, f"ckpt-{best[0]}")).expect_partial()
        log.info("Keeping the best step's model (train.keep_checkpoint=best): step %d, validation loss %.4f", *best)
    _save_model(state.model, inputs.tokenizer, ctx.run.model)
    summary = _summary(cfg, ctx, plan, state, loop, best)
    storage.write_json(ctx.run.train_summary, summary)  # last: marks training complete
    return summary


def _summary(
    cfg: PipelineConfig,
    ctx: RunContext,
    plan: TrainPlan,
    state: TrainState,
    loop: TrainLoop,
    best: tuple[int, float] | None,
) -> TrainSummary:
    import tensorflow as tf

    from mlm_tasks.model.flops import mfu

    progress, peak, history = loop.progress, loop.peak, state.history
    hours, cost, basis = _tpu_cost(cfg, plan.device, progress.elapsed_s)
    utilisation = mfu(progress.tokens_per_s, loop.flops_per_token, peak)
    return {
        "steps": loop.total,  # with a time budget, the steps it trained by the deadline
        "resumed_from_step": state.start_step,
        "global_batch": plan.global_batch,
        "replicas": plan.replicas,
        "device": plan.device,
        "xla": plan.xla,
        "precision": plan.precision,
        "precision_reason": plan.precision_reason,
        "steps_per_call": plan.per_call,
        "tokens_per_s": progress.tokens_per_s,
        "first_loss": progress.first_loss,
        "last_loss": progress.last_loss,
        "elapsed_s": progress.elapsed_s,
        "data_fingerprint": ctx.data.fingerprint,
        "val_loss": next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None),
        "best_step": best[0] if best else None,
        "best_val_loss": best[1] if best else None,
        "kept": "best" if cfg.train.keep_checkpoint == "best" and best else "last",
        "flops_per_token": loop.flops_per_token,
        "peak_flops": peak.total,
        "mfu": utilisation,
        "mfu_of": peak.describe(utilisation),
        "accelerator_hours": hours,
        "cost_usd": cost,
        "cost_basis": basis,
        "parameters": int(sum(v.shape.num_elements() for v in state.model.trainable_variables)),
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
    }


def _tpu_cost(cfg: PipelineConfig, device: str, elapsed_s: float) -> tuple[float | None, float | None, str | None]:
    """(hours, US$, basis) of the training on a TPU at the run's price (tpu.price_per_chip_hour or the list
    price); the VM's start and the steps around training are not in it. Nothing to count off a TPU."""
    if device != "tpu":
        return None, None, None
    from mlm_tasks.tpu import prices

    basis = f"{cfg.tpu.accelerator_type} {'Spot' if cfg.tpu.spot else 'on-demand'}, {prices.source(cfg.tpu)}"
    return elapsed_s / 3600, prices.cost(cfg.tpu, elapsed_s), basis


def _save_model(model, tokenizer, uri: str) -> None:
    """The model folder at `uri`: TensorFlow and PyTorch weights, config, tokenizer (the run's model, and
    each step the Hub sync pushes as a revision, mid-training)."""
    import tf_keras

    from mlm_tasks.model.pt_export import export_pytorch_weights

    # Saved in float32 whatever the training precision, so any CPU can load it; training's policy after.
    policy = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy("float32")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            export_pytorch_weights(tmp)  # model.safetensors: what PyTorch / transformers 5.x users load
            tokenizer.save_pretrained(tmp)
            storage.upload_dir(tmp, uri)
    finally:
        tf_keras.mixed_precision.set_global_policy(policy)
