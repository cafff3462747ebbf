"""The masked LM of `model.architecture` (transformers' `TFRobertaForMaskedLM` or mlm_tasks/model/modernbert.py),
its optimizer, and the loss that trains it.

    model = build_model(model_config(cfg, vocab_size, special_ids))   # in the strategy's scope
    loss_sum, count, correct = masked_lm_loss(model, batch, max_predictions=32, training=True)
"""

from __future__ import annotations

import json
import os

from mlm_tasks.config import PipelineConfig, TrainConfig
from mlm_tasks.model.modernbert_weights import assign_modernbert, modernbert_config, save_modernbert
from mlm_tasks.model.pt_export import SAFETENSORS_NAME, export_pytorch_weights, load_roberta_weights, read_safetensors
from mlm_tasks.model.schedule import decay_schedule


def model_vocab_size(cfg: PipelineConfig, tokenizer_size: int) -> int:
    """Rows of the model's embedding and LM head: the tokenizer's size, rounded up to model.vocab_multiple."""
    multiple = cfg.model.vocab_multiple
    return -(-tokenizer_size // multiple) * multiple if multiple and not cfg.model.init_from else tokenizer_size


def optimizer_and_schedule(train: TrainConfig, steps: int):
    """AdamW (no decay on norms and biases, as transformers.create_optimizer) and its schedule over `steps`."""
    from transformers import AdamWeightDecay

    warmup = int(steps * train.warmup_fraction)
    shape = {"linear": "linear", "one_cycle": "cosine"}.get(train.schedule, train.decay_shape)
    decay = train.decay_fraction if train.schedule == "wsd" else None
    schedule = decay_schedule(train.learning_rate, warmup, steps, shape, decay)  # type: ignore[arg-type]
    optimizer = AdamWeightDecay(
        learning_rate=schedule,
        weight_decay_rate=train.weight_decay,
        beta_1=0.9,
        beta_2=train.adam_beta2,
        epsilon=train.adam_epsilon,
        exclude_from_weight_decay=["LayerNorm", "layer_norm", "norm", "bias"],
    )
    return optimizer, schedule


def model_config(cfg: PipelineConfig, vocab_size: int, special_ids: dict, base_config: dict | None = None):
    """The model's config: the preset's shape, or the base's config.json (model.init_from); dropout is the run's."""
    from transformers import RobertaConfig

    if cfg.model.architecture == "modernbert":
        return _modernbert_config(cfg, vocab_size, special_ids, base_config)
    dropout = dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob"), cfg.model.dropout)
    if base_config is not None:
        return RobertaConfig.from_dict({**base_config, **dropout})
    return RobertaConfig(
        **cfg.model.shape().model_dump(),
        **dropout,
        vocab_size=model_vocab_size(cfg, vocab_size),
        type_vocab_size=1,
        pad_token_id=special_ids["pad"],
        bos_token_id=special_ids["bos"],
        eos_token_id=special_ids["eos"],
    )


def _modernbert_config(cfg: PipelineConfig, vocab_size: int, special_ids: dict, base_config: dict | None):
    """ModernBERT's config; a base's context grows to shards.max_length and model.rope_theta replaces its global
    RoPE base (context extension)."""
    m, drops = cfg.model, ("attention_dropout", "embedding_dropout", "mlp_dropout")
    if base_config is not None:
        values = {**base_config, **dict.fromkeys(drops, m.dropout)}
        grown = (base_config["max_position_embeddings"], cfg.shards.max_length, m.max_position_embeddings or 0)
        values["max_position_embeddings"] = max(grown)
    else:
        values = {
            **m.shape().model_dump(),
            **dict.fromkeys(drops, m.dropout),
            "vocab_size": model_vocab_size(cfg, vocab_size),
            "local_attention": m.local_attention,
            "global_rope_theta": 10_000.0,
            "pad_token_id": special_ids["pad"],
            **dict.fromkeys(("bos_token_id", "cls_token_id"), special_ids["bos"]),
            **dict.fromkeys(("eos_token_id", "sep_token_id"), special_ids["eos"]),
        }
    config = modernbert_config(values)
    if m.rope_theta:
        config.global_rope_theta = m.rope_theta
    return config


def build_model(config, sinusoidal_positions: bool = False):
    """A freshly initialised model, its variables created (needed before a checkpoint restore).
    `sinusoidal_positions`: RoBERTa's learned positions start from sinusoids (model.sinusoidal_init)."""
    import numpy as np
    import tensorflow as tf
    from transformers import TFRobertaForMaskedLM

    if config.model_type == "modernbert":
        from mlm_tasks.model.modernbert import build_modernbert

        return build_modernbert(config)  # RoPE: no position table to start from sinusoids
    model = TFRobertaForMaskedLM(config)
    dummy = tf.ones((1, 8), dtype=tf.int32) * 5
    model(input_ids=dummy, attention_mask=tf.ones_like(dummy), training=False)
    if sinusoidal_positions:
        table = model.roberta.embeddings.position_embeddings
        n, d = table.shape
        pos = np.arange(n)[:, None]
        freq = np.exp(-np.log(10000.0) * (np.arange(0, d, 2) / d))
        sinus = np.zeros((n, d), dtype=np.float32)
        sinus[:, 0::2], sinus[:, 1::2] = np.sin(pos * freq), np.cos(pos * freq)
        table.assign(sinus * (config.initializer_range / sinus.std()))
    return model


def save_masked_lm(model, folder: str) -> None:
    """config.json and weights: RoBERTa's tf_model.h5 (transformers 4.57) and model.safetensors (5.x, PyTorch
    names); ModernBERT's model.safetensors only."""
    if model.config.model_type == "modernbert":
        save_modernbert(model, folder)
        return
    model.save_pretrained(folder)
    export_pytorch_weights(folder)


def load_base_weights(model, folder: str) -> str:
    """The weights of model.init_from's `folder` into a built model; returns a line saying what was read."""
    if model.config.model_type != "modernbert":
        return load_roberta_weights(model, folder)
    path = os.path.join(folder, SAFETENSORS_NAME)  # the Keras ModernBERT: PyTorch names only
    return assign_modernbert(model, read_safetensors(path), path)


def load_masked_lm(folder: str):
    """The masked LM saved in a local `folder`, by its config.json's model_type."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    if model_type == "modernbert":
        from mlm_tasks.model.modernbert import load_modernbert

        return load_modernbert(folder)
    from transformers import TFRobertaForMaskedLM

    # 4.57 would otherwise pick the PyTorch model.safetensors beside it and fail to read it (transformers#40028).
    return TFRobertaForMaskedLM.from_pretrained(folder, use_safetensors=False)


def masked_lm_loss(model, batch, max_predictions: int, training: bool, packed: bool = False):
    """(summed loss, masked tokens, correct predictions) of one batch. The LM head, most of a small model's
    step, runs at the masked positions only: the first `max_predictions` of each sequence (static shapes for
    XLA; 0: the head runs everywhere), or with `packed` (shapes that change per batch: not for XLA or a TPU)
    exactly those, with no padding slots. Each gives the same loss when no sequence overflows."""
    import tensorflow as tf

    labels, ids, mask = batch["labels"], batch["input_ids"], batch["attention_mask"]
    if hasattr(model, "lm_logits"):  # the Keras ModernBERT
        hidden, lm_head = model.encode(ids, mask, training=training), model.lm_logits
    else:
        hidden, lm_head = model.roberta(input_ids=ids, attention_mask=mask, training=training)[0], model.lm_head
    if packed:
        is_masked = labels != -100
        if max_predictions:  # the same positions top_k picks below: the first max_predictions of each row
            is_masked &= tf.cumsum(tf.cast(is_masked, tf.int32), axis=1) <= max_predictions
        where = tf.where(is_masked)
        # One row of N positions: the LM head takes [batch, length, hidden].
        hidden, labels = tf.gather_nd(hidden, where)[None], tf.gather_nd(labels, where)[None]
    elif max_predictions:
        is_masked = tf.cast(labels != -100, tf.int32)
        # top_k on a 0/1 vector picks masked positions first (lowest index first among equals).
        _, positions = tf.math.top_k(is_masked, k=max_predictions)
        hidden = tf.gather(hidden, positions, batch_dims=1)
        labels = tf.gather(labels, positions, batch_dims=1)
    logits = tf.cast(lm_head(hidden), tf.float32)
    valid = labels != -100
    safe_labels = tf.where(valid, labels, 0)
    per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe_labels, logits=logits)
    weights = tf.cast(valid, tf.float32)
    correct = tf.cast(tf.argmax(logits, axis=-1, output_type=safe_labels.dtype) == safe_labels, tf.float32)
    return (tf.reduce_sum(per_token * weights), tf.reduce_sum(weights), tf.reduce_sum(correct * weights))
