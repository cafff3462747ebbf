"""The model, optimizer and checkpoints a plan trains, restored or started.

state = build_training(cfg, ctx.run, inputs, plan)   # TrainState: model, checkpoints, start step, history
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.model.roberta import load_base_weights
from mlm_tasks.paths import RunPaths
from mlm_tasks.training.plan import TrainInputs, TrainPlan
from mlm_tasks.training.progress import read_history
from mlm_tasks.training.step import model_and_optimizer
from mlm_tasks.training.validation import Validation, validation_batches

log = logging.getLogger("mlm_tasks.steps.train")


@dataclass
class TrainState:
    """What the loop trains and saves; `history`: the run's logged steps up to `start_step`."""

    model: Any
    optimizer: Any
    schedule: Any  # the learning-rate schedule (the progress lines print its value)
    step: Any  # tf.Variable: the step the checkpoint records
    budget_used_s: Any  # tf.Variable: seconds of train.budget_minutes used up to that step (0 without a budget)
    checkpoints: Any  # tf.train.CheckpointManager of runs/<run>/checkpoints (the last two)
    best: Any  # ... of RunPaths.train_best: the weights of the lowest validation loss
    validate: Any | None  # Validation (train.eval_every), None without it
    start_step: int
    history: list[dict[str, Any]]


def build_training(cfg: PipelineConfig, run: RunPaths, inputs: TrainInputs, plan: TrainPlan) -> TrainState:
    """Build the model and optimizer in the plan's strategy and their checkpoints; restore the run's latest
    checkpoint, else train.continue_run's, else load model.init_from's weights (else random)."""
    import tensorflow as tf

    model, optimizer, schedule = model_and_optimizer(
        plan.strategy, cfg, plan.model_config, plan.total_steps, from_base=inputs.base is not None
    )
    with plan.strategy.scope():
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        used_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="budget_used_s")
    # lr_plan and budget_used_s: a resume follows the re-planned schedule and gets the rest of the time budget.
    continued = {"lr_offset": schedule.offset} if cfg.train.continue_run else {}  # older checkpoints have none
    checkpoint = tf.train.Checkpoint(
        model=model, optimizer=optimizer, step=step, lr_plan=schedule.plan, budget_used_s=used_s, **continued
    )
    manager = tf.train.CheckpointManager(checkpoint, run.checkpoints, max_to_keep=2)
    validate = None
    if cfg.train.eval_every:
        validate = Validation(plan.strategy, model, validation_batches(inputs.shard_set, inputs.tokenizer, cfg))
    best = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run.train_best, max_to_keep=1)
    _restore_or_start(checkpoint, manager, step, inputs)
    start_step = int(step.numpy())  # int() refuses the Mirrored/TPU variable a strategy makes
    history = [h for h in read_history(run) if h["step"] <= start_step]
    return TrainState(model, optimizer, schedule, step, used_s, manager, best, validate, start_step, history)


def _restore_or_start(checkpoint: Any, manager: Any, step: Any, inputs: TrainInputs) -> None:
    import tensorflow as tf

    model, optimizer, base = checkpoint.model, checkpoint.optimizer, inputs.base
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("Resumed from %s at step %d", manager.latest_checkpoint, int(step.numpy()))
    elif inputs.continued:
        tf.train.Checkpoint(model=model, optimizer=optimizer).restore(inputs.continued).expect_partial()
        taken = int(optimizer.iterations.numpy())
        checkpoint.lr_offset.assign(float(taken))  # the optimizer's step count goes on; the schedule is this run's
        log.info("Continuing from %s: its weights and optimizer state (%d steps taken)", inputs.continued, taken)
    elif base is not None:
        with tempfile.TemporaryDirectory() as tmp:
            read = load_base_weights(model, base.local_folder(tmp))
        log.info("Starting from the base model %s at %s: %s", base.uri, base.identity()["revision"], read)
