"""The end of a training run: the model folder, then the training summary.

summary = finish(cfg, ctx, inputs, plan, state, loop)       # after the loop's final checkpoint
"""

from __future__ import annotations

import logging
import platform
import tempfile

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.model.flops import mfu
from mlm_tasks.model.roberta import save_masked_lm
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import TrainSummary
from mlm_tasks.tpu import prices
from mlm_tasks.training.loop import TrainLoop
from mlm_tasks.training.plan import TrainInputs, TrainPlan
from mlm_tasks.training.progress import best_so_far
from mlm_tasks.training.state import TrainState

log = logging.getLogger(__name__)


def finish(
    cfg: PipelineConfig, ctx: RunContext, inputs: TrainInputs, plan: TrainPlan, state: TrainState, loop: TrainLoop
) -> TrainSummary:
    """After the final checkpoint: the kept step's weights (train.keep_checkpoint) as the model, then the summary."""
    import tensorflow as tf

    best = best_so_far(state.history)
    if cfg.train.keep_checkpoint == "best" and best is not None and best[0] != loop.total:
        # After the final checkpoint (a resume must continue from the last step, not the best).
        tf.train.Checkpoint(model=state.model).restore(join(ctx.run.train_best, f"ckpt-{best[0]}")).expect_partial()
        log.info("Keeping the best step's model (train.keep_checkpoint=best): step %d, validation loss %.4f", *best)
    save_model(state.model, inputs.tokenizer, ctx.run.model)
    progress, peak, history = loop.progress, loop.peak, state.history
    hours, cost, basis = _tpu_cost(cfg, plan.device, progress.elapsed_s)
    utilisation = mfu(progress.tokens_per_s, loop.flops_per_token, peak)
    summary: TrainSummary = {
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
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
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
    storage.write_json(ctx.run.train_summary, summary)  # last: marks training complete
    return summary


def _tpu_cost(cfg: PipelineConfig, device: str, elapsed_s: float) -> tuple[float | None, float | None, str | None]:
    """(hours, US$, basis) of the training alone on a TPU at the run's price; None off a TPU."""
    if device != "tpu":
        return None, None, None
    basis = f"{cfg.tpu.accelerator_type} {'Spot' if cfg.tpu.spot else 'on-demand'}, {prices.source(cfg.tpu)}"
    return elapsed_s / 3600, prices.cost(cfg.tpu, elapsed_s), basis


def save_model(model, tokenizer, uri: str) -> None:
    """The model folder at `uri` (the run's model, and each step the Hub sync pushes): TensorFlow and PyTorch
    weights in float32, config, tokenizer."""
    import tf_keras

    # float32 whatever the training precision, so any CPU can load it; training's policy after.
    policy = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy("float32")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            save_masked_lm(model, tmp)  # model.safetensors: what PyTorch / transformers 5.x users load
            tokenizer.save_pretrained(tmp)
            storage.upload_dir(tmp, uri)
    finally:
        tf_keras.mixed_precision.set_global_policy(policy)
