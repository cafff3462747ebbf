"""Fine-tune the encoder (or random weights of its shape) on one task for a fixed budget and one seed, and
score it. The seed fixes the head's weights, the batch order and dropout: one seed gives one score.

    scores = finetune(model_dir, encode(tokenizer, train, n), encode(...), labels, budget, seed, pretrained=True)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlm_tasks import storage
from mlm_tasks.config import DownstreamConfig
from mlm_tasks.downstream.examples import Examples
from mlm_tasks.downstream.metrics import scores as metric_scores
from mlm_tasks.paths import join

log = logging.getLogger(__name__)
EVAL_BATCH = 64


@dataclass
class Encoded:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray


def encode(tokenizer, examples: Examples, max_length: int) -> Encoded:
    """Token ids padded to the longest example (at most max_length; a pair shares the length)."""
    out = tokenizer(
        examples.texts,
        examples.pairs,
        truncation=True,
        max_length=max_length,
        padding="longest",
        return_token_type_ids=False,
        return_tensors="np",
    )
    labels = np.asarray(examples.labels)
    return Encoded(
        out["input_ids"].astype(np.int32),
        out["attention_mask"].astype(np.int32),
        # Values stay float64, as the task gave them: the scores and the gate's rescoring read the same numbers.
        labels.astype(np.float64 if labels.dtype.kind == "f" else np.int32),
    )


def _batch_order(n: int, batch_size: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """`steps` batches of indices: epochs of seeded permutations, one after the other."""
    need = steps * batch_size
    order = np.concatenate([rng.permutation(n) for _ in range(-(-need // n))])[:need]
    return order.reshape(steps, batch_size)


def _model(model_dir: str, num_labels: int, pretrained: bool):
    from transformers import RobertaConfig, TFRobertaForSequenceClassification
    from transformers.utils import logging as hf_logging

    if storage.read_json(join(model_dir, "config.json")).get("model_type") == "modernbert":
        from mlm_tasks.model.modernbert import load_modernbert

        return load_modernbert(model_dir, num_labels, pretrained)
    if not pretrained:
        return TFRobertaForSequenceClassification(RobertaConfig.from_pretrained(model_dir, num_labels=num_labels))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "the classifier is newly initialized": that is the point here
    try:
        # use_safetensors=False: read tf_model.h5 (transformers 4.57 would pick model.safetensors, transformers#40028).
        return TFRobertaForSequenceClassification.from_pretrained(
            model_dir, num_labels=num_labels, use_safetensors=False
        )
    finally:
        hf_logging.set_verbosity(verbosity)


def finetune(
    model_dir: str,
    train: Encoded,
    validation: Encoded,
    num_labels: int,
    budget: DownstreamConfig,
    seed: int,
    pretrained: bool,
) -> dict[str, Any]:
    """Fine-tune a fresh classifier (one output and squared error for a regression: num_labels 1) for
    `budget.steps` steps; its scores on `validation`, and its predictions (the bootstrap and the gate's
    paired comparison read them)."""
    import tensorflow as tf
    from transformers import create_optimizer

    started = time.perf_counter()
    regression = num_labels == 1
    tf.keras.utils.set_random_seed(seed)  # the head's init and dropout
    model = _model(model_dir, num_labels, pretrained)
    optimizer, _ = create_optimizer(
        init_lr=budget.learning_rate,
        num_train_steps=budget.steps,
        num_warmup_steps=budget.steps // 10,
        weight_decay_rate=0.01,
    )

    @tf.function
    def train_step(ids, mask, labels):
        with tf.GradientTape() as tape:
            logits = model(input_ids=ids, attention_mask=mask, training=True).logits
            if regression:
                loss = tf.reduce_mean(tf.square(logits[:, 0] - tf.cast(labels, logits.dtype)))
            else:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    def predict(ids, mask):  # eager: a few batches, not worth a trace per run
        logits = model(input_ids=ids, attention_mask=mask, training=False).logits
        return logits[:, 0] if regression else tf.argmax(logits, -1, output_type=tf.int32)

    order = _batch_order(len(train.labels), budget.batch_size, budget.steps, np.random.default_rng(seed))
    losses = [float(train_step(train.input_ids[b], train.attention_mask[b], train.labels[b])) for b in order]
    n = len(validation.labels)
    pad = -n % EVAL_BATCH  # whole batches only: one shape, one trace
    ids, mask = (np.pad(a, ((0, pad), (0, 0))) for a in (validation.input_ids, validation.attention_mask))
    predictions = np.concatenate(
        [predict(ids[i : i + EVAL_BATCH], mask[i : i + EVAL_BATCH]).numpy() for i in range(0, n + pad, EVAL_BATCH)]
    )[:n]
    scores = metric_scores(predictions, validation.labels, num_labels, regression)
    result: dict[str, Any] = {
        "seed": seed,
        **scores,
        "final_loss": float(np.mean(losses[-10:])),
        "elapsed_s": time.perf_counter() - started,
        # As scored (float32 values exactly): the interval and the gate rescore these, and must get the same number.
        "predictions": [float(p) for p in predictions] if regression else [int(p) for p in predictions],
    }
    log.info(
        "  seed %d, %s weights: %s, final_loss %.4f (%.1fs)",
        *(seed, "pretrained" if pretrained else "random", ", ".join(f"{k} {v:.4f}" for k, v in scores.items())),
        *(result["final_loss"], result["elapsed_s"]),
    )
    return result
