"""Step: evaluate the trained model — masked-LM loss, perplexity, masked-token accuracy.

    python -m mlm_tasks evaluate --config configs/default.yaml --run-id my-run --data-fingerprint FP

Two reference points are measured on exactly the same masked batches, so "it learned" is a fact
in metrics.json rather than a feeling: the untrained model (same shape and seed, no training) and
the unigram baseline (always predict the most frequent token of the train split).
"""
from __future__ import annotations

import logging
import math
import tempfile
from collections import Counter

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths

log = logging.getLogger(__name__)


def most_frequent_token(paths, manifest: dict, special_ids: set[int], max_records: int = 20_000) -> int:
    import numpy as np
    import tensorflow as tf

    from mlm_tasks.shards import shard_uris

    counts: Counter = Counter()
    feature = {"input_ids": tf.io.FixedLenFeature([manifest["max_length"]], tf.int64)}
    ds = tf.data.TFRecordDataset(shard_uris(paths, manifest, "train")).take(max_records).batch(1024)
    for batch in ds:
        ids = tf.io.parse_example(batch, feature)["input_ids"].numpy().ravel()
        values, freq = np.unique(ids, return_counts=True)
        counts.update(dict(zip(values.tolist(), freq.tolist())))
    for token, _ in counts.most_common():
        if token not in special_ids:
            return token
    raise ValueError("The train split holds only special tokens.")


def _score(model, batches, max_predictions: int = 0) -> tuple[float, float, int]:
    from mlm_tasks.model import masked_lm_loss

    loss_sum = count = correct = 0.0
    for batch in batches:
        l, c, k = masked_lm_loss(model, batch, max_predictions, training=False)
        loss_sum, count, correct = loss_sum + float(l), count + float(c), correct + float(k)
    return loss_sum / max(count, 1), correct / max(count, 1), int(count)


def evaluate(cfg: PipelineConfig, run_id: str, fingerprint: str) -> dict:
    import tensorflow as tf
    from transformers import TFRobertaForMaskedLM

    from mlm_tasks.data import mlm_dataset
    from mlm_tasks.model import build_model
    from mlm_tasks.tokenizer import load_tokenizer
    from mlm_tasks.train import load_manifest

    run = RunPaths(cfg.output_root, run_id)
    if storage.exists(run.eval_metrics):
        log.info("Metrics already at %s: nothing to do", run.eval_metrics)
        return storage.read_json(run.eval_metrics)
    if not storage.exists(run.train_summary):
        raise FileNotFoundError(f"No trained model for run {run_id} ({run.train_summary} missing): run the "
                                "train step first.")
    paths, manifest = load_manifest(cfg, fingerprint)
    split = cfg.eval.split
    tokenizer = load_tokenizer(paths.tokenizer, manifest["max_length"])
    with tempfile.TemporaryDirectory() as tmp:
        model = TFRobertaForMaskedLM.from_pretrained(storage.download_dir(run.model, tmp))
    if model.config.vocab_size != len(tokenizer):
        raise ValueError(f"Model vocab {model.config.vocab_size} != tokenizer vocab {len(tokenizer)}: the model "
                         f"at {run.model} was trained with another tokenizer.")

    # Fixed seed: every run (and the previously published model) is scored on identical masks.
    tf.random.set_seed(cfg.train.seed)
    ds = mlm_dataset(paths, manifest, split, tokenizer, cfg.eval.batch_size, training=False,
                     mlm_probability=cfg.train.mlm_probability, seed=cfg.train.seed)
    if cfg.eval.max_batches:
        ds = ds.take(cfg.eval.max_batches)
    batches = list(ds)  # the same masked batches for all three scores

    loss, accuracy, masked = _score(model, batches)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    untrained = build_model(model.config)
    untrained_loss, untrained_acc, _ = _score(untrained, batches)
    top = most_frequent_token(paths, manifest, set(tokenizer.all_special_ids))
    labels = tf.concat([tf.reshape(b["labels"], [-1]) for b in batches], 0)
    labels = tf.boolean_mask(labels, labels != -100)
    baseline = float(tf.reduce_mean(tf.cast(labels == top, tf.float32)))

    metrics = {"split": split, "loss": loss, "perplexity": math.exp(min(loss, 50)), "accuracy": accuracy,
               "masked_tokens": masked, "untrained_loss": untrained_loss, "untrained_accuracy": untrained_acc,
               "baseline_accuracy": baseline, "baseline_token": tokenizer.convert_ids_to_tokens(top),
               "data_fingerprint": fingerprint}
    storage.write_json(run.eval_metrics, metrics)
    log.info("Eval on %s (%d masked tokens): loss %.3f, perplexity %.1f, accuracy %.1f%% | untrained: loss "
             "%.3f, accuracy %.1f%% | always %r: %.1f%%", split, masked, loss, metrics["perplexity"],
             100 * accuracy, untrained_loss, 100 * untrained_acc, metrics["baseline_token"], 100 * baseline)
    return metrics
