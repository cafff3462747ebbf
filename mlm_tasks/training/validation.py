"""Validation every `train.eval_every` steps: the masked-LM loss on fixed batches and masks (15%, seeded), so
runs on one shard set, and a resumed run, score the same positions. docs/configuration.md

    validate = Validation(strategy, model, validation_batches(shard_set, tokenizer, cfg))
    loss, accuracy, tokens = validate()
"""

from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.data.input import mlm_dataset
from mlm_tasks.errors import ConfigError
from mlm_tasks.model.roberta import masked_lm_loss

log = logging.getLogger(__name__)

EVAL_MLM_PROBABILITY = 0.15  # BERT's and RoBERTa's rate: the one every published MLM loss is quoted at


def fixed_masks(shard_set: Any, tokenizer: Any, cfg: Any) -> Any:
    """`eval.split` in batches of eval.batch_size, masked at EVAL_MLM_PROBABILITY with the run's seed."""
    split, batch = cfg.eval.split, cfg.eval.batch_size
    return mlm_dataset(
        shard_set, split, tokenizer, batch, training=False, mlm_probability=EVAL_MLM_PROBABILITY, seed=cfg.train.seed
    )


def validation_batches(shard_set: Any, tokenizer: Any, cfg: Any) -> Any:
    """The first `train.eval_batches` whole batches (a TPU compiles one shape) of `eval.split`, masked once."""
    split, batch = cfg.eval.split, cfg.eval.batch_size
    whole = shard_set.records(split) // batch
    if whole < 1:
        raise ConfigError(
            f"train.eval_every needs at least one whole batch of {split}: it has {shard_set.records(split)} records, "
            f"eval.batch_size is {batch}. Lower eval.batch_size or raise corpus.validation_fraction."
        )
    count = min(cfg.train.eval_batches, whole)
    log.info(
        "Validation every %d steps on %d batch(es) of %d %s records (%d%% fixed masking)",
        cfg.train.eval_every,
        count,
        batch,
        split,
        round(100 * EVAL_MLM_PROBABILITY),
    )
    return fixed_masks(shard_set, tokenizer, cfg).take(count).cache()


class Validation:
    """Scores `model` on `dataset` under `strategy`: (loss, accuracy, masked tokens), over all its batches."""

    def __init__(self, strategy: Any, model: Any, dataset: Any) -> None:
        import tensorflow as tf

        self.dataset = strategy.experimental_distribute_dataset(dataset)

        @tf.function
        def batch_sums(batch: Any) -> list[Any]:
            per_replica = strategy.run(lambda b: masked_lm_loss(model, b, 0, training=False), args=(batch,))
            return [strategy.reduce("SUM", v, axis=None) for v in per_replica]

        self._batch_sums = batch_sums

    def __call__(self) -> tuple[float, float, int]:
        sums = [0.0, 0.0, 0.0]
        for batch in self.dataset:
            sums = [total + float(v) for total, v in zip(sums, self._batch_sums(batch), strict=True)]
        loss_sum, count, correct = sums
        return loss_sum / max(count, 1.0), correct / max(count, 1.0), int(count)
