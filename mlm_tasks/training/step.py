"""The model and optimizer in the strategy's scope, the train input, and the compiled k-step call (shared by
the run and the time budget's measurement).

    model, optimizer, schedule = model_and_optimizer(strategy, cfg, model_config, steps, from_base=False)
    batches = train_input(cfg, shard_set, tokenizer, global_batch, skip=0, take=steps)
    iterator = iter(strategy.distribute_datasets_from_function(batches))
    sums = step_functions(strategy, model, optimizer, max_pred, xla, clip_norm=1.0)(iterator, k).numpy()  # k x 4
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.input import mlm_dataset
from mlm_tasks.data.shard_set import source_weights
from mlm_tasks.model.roberta import build_model, masked_lm_loss, optimizer_and_schedule


def model_and_optimizer(
    strategy: Any, cfg: PipelineConfig, model_config: Any, steps: int, *, from_base: bool
) -> tuple[Any, Any, Any]:
    """(model, optimizer, learning-rate schedule over `steps`) on the strategy's devices. `from_base`: skip the
    sinusoidal init the base's weights overwrite."""
    with strategy.scope():
        built = build_model(model_config, sinusoidal_positions=cfg.model.sinusoidal_init and not from_base)
        optimizer, schedule = optimizer_and_schedule(cfg.train, steps)
        return built, optimizer, schedule


def train_input(
    cfg: PipelineConfig, shard_set: Any, tokenizer: Any, global_batch: int, skip: int, take: int
) -> Callable[[Any], Any]:
    """The masked train batches `skip`..`skip + take`, as a function of the input context (one per host)."""
    weights = source_weights(cfg, shard_set)  # a mixture's, matched by name to the set's sources

    def batches(input_context: Any) -> Any:
        return mlm_dataset(
            shard_set,
            "train",
            tokenizer,
            global_batch,
            mlm_probability=cfg.train.mlm_probability,
            whole_word_mask=cfg.train.whole_word_mask,
            max_predictions=cfg.train.max_predictions_per_seq,  # whole words: none cut by the head's slots
            replace=(cfg.train.mask_replace_prob, cfg.train.random_replace_prob),
            seed=cfg.train.seed,
            shuffle_buffer=cfg.train.shuffle_buffer,
            skip_batches=skip,
            take_batches=take,
            input_context=input_context,
            weights=weights,
        )

    return batches


def step_functions(
    strategy: Any, model: Any, optimizer: Any, max_pred: int, xla: bool, clip_norm: float = 0.0, stop: Any = None
) -> Any:
    """`distributed_steps(iterator, k)`: k optimizer steps in one device-side call, each step's [loss sum, masked
    tokens, correct, unclipped gradient norm] (k x 4). Gradients are summed over the replicas before the clip to
    `clip_norm` (0: none), so it sees the whole gradient. `stop` (a tf.Variable) ends the call after a step."""
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    # Without XLA off a TPU, shapes may change per batch: the LM head runs at the masked positions, unpadded.
    packed = not xla and not isinstance(strategy, tf.distribute.TPUStrategy)

    @tf.function(jit_compile=xla)
    def replica_step(batch):
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum, count, correct = masked_lm_loss(model, batch, max_pred, training=True, packed=packed)
            loss = loss_sum / tf.maximum(count, 1.0) / replicas
        grads = tf.distribute.get_replica_context().all_reduce("SUM", tape.gradient(loss, variables))
        norm = tf.linalg.global_norm(grads)
        if clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=norm)
        optimizer.apply_gradients(zip(grads, variables, strict=True), experimental_aggregate_gradients=False)
        return loss_sum, count, correct, norm

    @tf.function
    def distributed_steps(it, k: int):
        sums = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        for i in tf.range(k):
            if stop is not None and stop:
                break
            loss_sum, count, correct, norm = strategy.run(replica_step, args=(next(it),))
            summed = [strategy.reduce("SUM", v, axis=None) for v in (loss_sum, count, correct)]
            sums = sums.write(i, tf.stack([*summed, strategy.reduce("MEAN", norm, axis=None)]))
        return sums.stack()

    return distributed_steps
