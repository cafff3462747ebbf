"""The train step's guards: global-norm clipping of the replicas' summed gradient (train.clip_norm), the
gradient norm in the progress entries, and a non-finite step stopping the run with its last good checkpoint.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/training/test_step.py -q
"""

import math

import numpy as np
import pytest

from mlm_tasks.errors import NO_RETRY_EXIT, TrainingDivergedError
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunContext
from mlm_tasks.training.progress import read_history
from peers.tiny_data import tiny_config


def _update_and_norm(strategy, clip_norm: float, xla: bool) -> tuple[float, float]:
    """(global norm of one SGD(lr=1) step's weight change, the gradient norm the step reports) for a tiny
    RoBERTa whose word embeddings are scaled 1,000x: a planted huge gradient."""
    import tensorflow as tf
    import tf_keras
    from transformers import RobertaConfig

    from mlm_tasks.model.roberta import build_model
    from mlm_tasks.training.step import step_functions

    tf.keras.utils.set_random_seed(0)
    config = RobertaConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=20, type_vocab_size=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    with strategy.scope():
        model = build_model(config)
        optimizer = tf_keras.optimizers.legacy.SGD(learning_rate=1.0)
    embeddings = model.roberta.embeddings.weight
    embeddings.assign(embeddings * 1000.0)
    ids = tf.constant(np.random.default_rng(0).integers(5, 50, size=(4, 16)), tf.int32)
    labels = tf.where(tf.range(16)[None] % 3 == 0, ids, -100)  # a third of the positions carry a label
    batch = {"input_ids": ids, "attention_mask": tf.ones_like(ids), "labels": labels}
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat())
    before = [v.numpy() for v in model.trainable_variables]
    row = step_functions(strategy, model, optimizer, 8, xla, clip_norm)(iter(data), 1).numpy()[0]
    change = math.sqrt(
        sum(np.sum((v.numpy() - b) ** 2) for v, b in zip(model.trainable_variables, before, strict=True))
    )
    return change, float(row[3])


@pytest.mark.parametrize("strategy_kind, xla", [("default", False), ("mirrored", False), ("mirrored", True)])
def test_clipping_bounds_a_planted_huge_gradient_and_the_reported_norm_is_the_unclipped_one(strategy_kind, xla):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy() if strategy_kind == "mirrored" else tf.distribute.get_strategy()
    raw_change, raw_norm = _update_and_norm(strategy, 0.0, xla)
    assert raw_norm > 100 and raw_change == pytest.approx(raw_norm, rel=1e-3)  # unclipped: SGD moves by the norm
    clipped_change, clipped_norm = _update_and_norm(strategy, 1.0, xla)
    assert clipped_norm == pytest.approx(raw_norm, rel=1e-4)  # the same step's norm, before the clip
    assert clipped_change == pytest.approx(1.0, rel=1e-3)  # the update is the gradient scaled to norm 1


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_non_finite_step_stops_the_run_naming_it_and_the_last_good_checkpoint_stays_finite(tiny_prepared):
    """A NaN planted in the weights after the call ending at step 8 (its checkpoint saved) makes step 9's loss
    NaN: the run stops with TrainingDivergedError (no retry) before saving anything of steps 9-12, the status
    record says so, and the checkpoint of step 8 restores finite weights."""
    import tensorflow as tf

    from mlm_tasks.training.hooks import TrainHook
    from mlm_tasks.training.loop import TrainLoop
    from mlm_tasks.training.plan import load_inputs, plan_training
    from mlm_tasks.training.state import build_training

    cfg, data = tiny_prepared
    cfg = tiny_config(
        cfg.output_root,
        **{"train.steps": 16, "train.steps_per_call": 4, "train.checkpoint_every": 5, "train.log_every": 1},
    )
    ctx = RunContext.of(cfg, "diverges", data["fingerprint"])
    inputs = load_inputs(cfg, ctx)
    plan = plan_training(cfg, ctx.run, inputs)
    state = build_training(cfg, ctx.run, inputs, plan)

    class PoisonAfter(TrainHook):
        def on_steps(self, first: int, last: int) -> None:
            if last == 8:
                gamma = state.model.roberta.embeddings.LayerNorm.gamma
                gamma.assign(tf.fill(gamma.shape, float("nan")))

    loop = TrainLoop(cfg, ctx.run, inputs, plan, state, [PoisonAfter()])
    with pytest.raises(TrainingDivergedError, match=r"diverged at step 9: loss nan.*checkpoints/ckpt-8\b"), loop.status:
        loop.run()
    status = read_status(ctx.run)
    assert status["state"] == "failed" and status["exit_code"] == NO_RETRY_EXIT
    assert status["error"].startswith("TrainingDivergedError: Training diverged at step 9")
    from mlm_tasks.steps.summary import summary

    text = summary(cfg, ctx, data=data)["text"]
    assert "Training   failed (exit 2): TrainingDivergedError: Training diverged at step 9: loss nan" in text
    assert tf.train.latest_checkpoint(ctx.run.checkpoints).endswith("ckpt-8")
    reader = tf.train.load_checkpoint(ctx.run.checkpoints)
    weights = [reader.get_tensor(name) for name, _ in tf.train.list_variables(ctx.run.checkpoints)]
    assert all(np.isfinite(w).all() for w in weights if np.issubdtype(np.asarray(w).dtype, np.floating))
    history = read_history(ctx.run)  # written with the checkpoint of step 8: every entry has a finite norm
    assert [h["step"] for h in history] == list(range(1, 9))
    assert all(0 < h["grad_norm"] < math.inf for h in history)
