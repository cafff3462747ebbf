"""Evaluate a trained masked LM on `eval.split` beside the untrained model (same shape and seed) and the
unigram baseline, on the same masked batches, so "it learned" is a fact in metrics.json.

    metrics = evaluate_model(cfg, ctx)          # EvalMetrics; the evaluate step writes them
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections import Counter
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import load_manifest
from mlm_tasks.data.tokenizer import load_tokenizer
from mlm_tasks.errors import ConfigError
from mlm_tasks.model.roberta import build_model, load_masked_lm, model_vocab_size
from mlm_tasks.paths import RunContext
from mlm_tasks.results import EvalMetrics
from mlm_tasks.training.validation import fixed_masks

log = logging.getLogger(__name__)


def most_frequent_token(shard_set, special_ids: set[int], max_records: int = 20_000) -> int:
    import numpy as np
    import tensorflow as tf

    counts: Counter = Counter()
    feature = {"input_ids": tf.io.FixedLenFeature([shard_set.max_length], tf.int64)}
    ds = tf.data.TFRecordDataset(shard_set.shard_uris("train")).take(max_records).batch(1024)
    for batch in ds:
        ids = tf.io.parse_example(batch, feature)["input_ids"].numpy().ravel()
        values, freq = np.unique(ids, return_counts=True)
        counts.update(dict(zip(values.tolist(), freq.tolist(), strict=False)))
    for token, _ in counts.most_common():
        if token not in special_ids:
            return token
    raise ValueError("The train split holds only special tokens.")


def _score(model, batches, mask_id: int) -> tuple[float, float, int, float]:
    """(loss, accuracy, count) over every selected position, and the accuracy where the input shows <mask>
    (unlike a token left unchanged, it cannot be copied)."""
    import tensorflow as tf

    loss_sum = count = correct = at_mask = masks = 0.0
    for batch in batches:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        logits = tf.cast(model(input_ids=ids, attention_mask=mask, training=False).logits, tf.float32)
        valid = labels != -100
        safe = tf.where(valid, labels, 0)
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe, logits=logits)
        hit = tf.argmax(logits, -1, output_type=safe.dtype) == safe
        shown_mask = valid & (ids == mask_id)
        loss_sum += float(tf.reduce_sum(tf.where(valid, per_token, 0.0)))
        count += float(tf.reduce_sum(tf.cast(valid, tf.float32)))
        correct += float(tf.reduce_sum(tf.cast(hit & valid, tf.float32)))
        at_mask += float(tf.reduce_sum(tf.cast(hit & shown_mask, tf.float32)))
        masks += float(tf.reduce_sum(tf.cast(shown_mask, tf.float32)))
    return loss_sum / max(count, 1), correct / max(count, 1), int(count), at_mask / max(masks, 1)


def evaluate_model(cfg: PipelineConfig, ctx: RunContext) -> EvalMetrics:
    """Score run `ctx.run_id`'s trained model on `eval.split` of shard set `ctx.fingerprint`."""
    import tensorflow as tf

    fingerprint = ctx.data.fingerprint
    shard_set = load_manifest(cfg, fingerprint)
    split = cfg.eval.split
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    model = _trained_model(cfg, ctx, len(tokenizer))

    # The fixed seed and rate of train.eval_every: every run (and the published model) is scored on the same masks.
    tf.random.set_seed(cfg.train.seed)
    ds = fixed_masks(shard_set, tokenizer, cfg)
    batches = list(ds.take(cfg.eval.max_batches) if cfg.eval.max_batches else ds)  # the same batches for all three
    loss, accuracy, masked, mask_acc = _score(model, batches, tokenizer.mask_token_id)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    untrained = build_model(model.config)
    untrained_loss, untrained_acc, _, _ = _score(untrained, batches, tokenizer.mask_token_id)
    top = most_frequent_token(shard_set, set(tokenizer.all_special_ids))
    labels = tf.concat([tf.reshape(b["labels"], [-1]) for b in batches], 0)
    labels = tf.boolean_mask(labels, labels != -100)
    baseline = float(tf.reduce_mean(tf.cast(labels == top, tf.float32)))

    metrics: EvalMetrics = {
        "split": split,
        "loss": loss,
        "perplexity": math.exp(min(loss, 50)),
        "accuracy": accuracy,
        "accuracy_at_mask_token": mask_acc,
        "masked_tokens": masked,
        "untrained_loss": untrained_loss,
        "untrained_accuracy": untrained_acc,
        "baseline_accuracy": baseline,
        "baseline_token": tokenizer.convert_ids_to_tokens(top),
        "data_fingerprint": fingerprint,
    }
    log.info(
        "Eval on %s (%d masked tokens): loss %.3f, perplexity %.1f, accuracy %.1f%% (%.1f%% where the "
        "input shows <mask>) | untrained: loss %.3f, accuracy %.1f%% | always %r: %.1f%%",
        split,
        masked,
        loss,
        metrics["perplexity"],
        100 * accuracy,
        100 * mask_acc,
        untrained_loss,
        100 * untrained_acc,
        metrics["baseline_token"],
        100 * baseline,
    )
    return metrics


def _trained_model(cfg: PipelineConfig, ctx: RunContext, tokenizer_size: int) -> Any:
    """The run's trained model, refused when its vocabulary is not the tokenizer's."""
    run, fingerprint = ctx.run, ctx.data.fingerprint
    with tempfile.TemporaryDirectory() as tmp:
        model = load_masked_lm(storage.download_dir(run.model, tmp))
    if model.config.vocab_size != model_vocab_size(cfg, tokenizer_size):
        trained_on = storage.read_json(run.train_summary).get("data_fingerprint", "?")
        raise ConfigError(
            f"Model vocab {model.config.vocab_size} != tokenizer vocab {tokenizer_size}: the model at "
            f"{run.model} was trained with another tokenizer (data {trained_on}, not {fingerprint}). "
            "Evaluate with the data fingerprint the run trained on, or retrain on this data."
        )
    return model
