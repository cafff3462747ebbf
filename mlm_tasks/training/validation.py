"""Validation every `train.eval_every` steps: the masked-LM loss on fixed batches and masks (15%, seeded), so
runs on one shard set, and a resumed run, score the same positions. docs/configuration.md

    validate = Validation(strategy, model, validation_batches(shard_set, tokenizer, cfg))
    loss, accuracy, tokens = validate()
"""

from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.errors import ConfigError

log = logging.getLogger(__name__)

EVAL_MLM_PROBABILITY = 0.15  # BERT's and RoBERTa's rate: the one every published MLM loss is quoted at


def fixed_masks(shard_set: Any, tokenizer: Any, cfg: Any) -> Any:
    """`eval.split` in batches of eval.batch_size, masked at EVAL_MLM_PROBABILITY with the run's seed."""
    from mlm_tasks.data.input import mlm_dataset

    return mlm_dataset(
        shard_set,
        cfg.eval.split,
        tokenizer,
        cfg.eval.batch_size,
        training=False,
        mlm_probability=EVAL_MLM_PROBABILITY,
        seed=cfg.train.seed,
    )


def validation_batches(shard_set: Any, tokenizer: Any, cfg: Any) -> Any:
    """The first `train.eval_batches` whole batches (a TPU compiles one shape) of `eval.split`, masked once."""
    split, batch = cfg.eval.split, cfg.eval.batch_size
    whole = shard_set.records(split) // batch
    if whole < 1:
        raise ConfigError(
            f"train.eval_every needs at least one whole batch of {split}: it has "
            f"{shard_set.records(split)} records, eval.batch_size is {batch}. Lower eval.batch_size "
            "or raise corpus.validation_fraction."
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

        from mlm_tasks.model.roberta import masked_lm_loss

        self.strategy = strategy
        self.dataset = strategy.experimental_distribute_dataset(dataset)

        @tf.function
        def batch_sums(batch: Any) -> list[Any]:
            per_replica = strategy.run(lambda b: masked_lm_loss(model, b, 0, training=False), args=(batch,))
            return [strategy.reduce("SUM", v, axis=None) for v in per_replica]

        self._batch_sums = batch_sums

    def __call__(self) -> tuple[float, float, int]:
        loss_sum = count = correct = 0.0
        for batch in self.dataset:
            batch_loss, batch_count, batch_correct = self._batch_sums(batch)
            loss_sum += float(batch_loss)
            count += float(batch_count)
            correct += float(batch_correct)
        return loss_sum / max(count, 1.0), correct / max(count, 1.0), int(count)
