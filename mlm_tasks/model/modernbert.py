"""A ModernBERT-shaped masked LM in tf-keras, layer for layer transformers 5.24's `ModernBertForMaskedLM`
(docs/configuration.md, ModernBERT). Norms and RoPE run in fp32, the rest in the Keras policy's compute dtype.

    model = build_modernbert(config)   # config: transformers' ModernBertConfig
    logits = model.lm_logits(model.encode(ids, mask, training=True))
"""

from __future__ import annotations

import math
import os
from typing import Any

import tensorflow as tf
import tf_keras

from mlm_tasks.model.modernbert_weights import GLOBAL, LOCAL, assign_modernbert, layer_types, parameters, read_config
from mlm_tasks.model.pt_export import SAFETENSORS_NAME, read_safetensors


def _init(std: float) -> Any:  # ModernBERT's: a normal cut at 2 std (initializer_cutoff_factor)
    return tf_keras.initializers.TruncatedNormal(stddev=std)


def _dense(units: int, bias: bool, std: float, name: str) -> Any:
    return tf_keras.layers.Dense(units, use_bias=bias, kernel_initializer=_init(std), name=name)


class Norm(tf_keras.layers.Layer):
    """torch.nn.LayerNorm (bias only with norm_bias), computed in fp32, returned in the input's dtype."""

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(dtype="float32", autocast=False, **kwargs)
        self.eps, self.use_bias = config.norm_eps, config.norm_bias

    def build(self, input_shape: Any) -> None:
        dim = int(input_shape[-1])
        self.weight = self.add_weight("weight", (dim,), initializer="ones")
        self.bias = self.add_weight("bias", (dim,), initializer="zeros") if self.use_bias else None

    def call(self, x: Any) -> Any:
        x32 = tf.cast(x, tf.float32)
        mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
        y = (x32 - mean) * tf.math.rsqrt(var + self.eps) * self.weight
        return tf.cast(y + self.bias if self.bias is not None else y, x.dtype)


def rope(length: Any, head_dim: int, theta: float) -> tuple[Any, Any]:
    """(cos, sin) [length, head_dim] in fp32, frequencies repeated as in torch."""
    inv_freq = 1.0 / (theta ** (tf.range(0, head_dim, 2, dtype=tf.float32) / head_dim))
    freqs = tf.cast(tf.range(length), tf.float32)[:, None] * inv_freq[None, :]
    emb = tf.concat([freqs, freqs], axis=-1)
    return tf.cos(emb), tf.sin(emb)


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    x32 = tf.cast(x, tf.float32)
    x1, x2 = tf.split(x32, 2, axis=-1)
    return tf.cast(x32 * cos + tf.concat([-x2, x1], axis=-1) * sin, x.dtype)


def attention_biases(attention_mask: Any, config: Any) -> dict[str, Any]:
    """{layer type: fp32 bias [batch, 1, query, key]}: 0 where a query may look, -1e9 where not: padding keys,
    and on a local layer keys farther than local_attention // 2."""
    length = tf.shape(attention_mask)[1]
    keys = tf.cast(attention_mask, tf.bool)[:, None, None, :]
    window = tf.abs(tf.range(length)[:, None] - tf.range(length)[None, :]) <= config.local_attention // 2
    blocked = tf.constant(-1e9, tf.float32)
    return {GLOBAL: tf.where(keys, 0.0, blocked), LOCAL: tf.where(keys & window[None, None], 0.0, blocked)}


class Attention(tf_keras.layers.Layer):
    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(**kwargs)
        h, self.heads = config.hidden_size, config.num_attention_heads
        self.head_dim = h // self.heads
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.Wqkv = _dense(3 * h, config.attention_bias, config.initializer_range, "Wqkv")
        self.Wo = _dense(h, config.attention_bias, out_std, "Wo")
        self.drop = tf_keras.layers.Dropout(config.attention_dropout)
        self.out_drop = tf_keras.layers.Dropout(config.attention_dropout)

    def call(self, x: Any, bias: Any, cos: Any, sin: Any, training: bool = False) -> Any:
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(self.Wqkv(x), [batch, length, 3, self.heads, self.head_dim])
        q, k, v = tf.unstack(qkv, axis=2)  # [batch, length, heads, head_dim]
        q, k = _rotate(q, cos[:, None, :], sin[:, None, :]), _rotate(k, cos[:, None, :], sin[:, None, :])
        scores = tf.einsum("bqhd,bkhd->bhqk", q, k) * tf.cast(self.head_dim**-0.5, q.dtype)
        probs = tf.nn.softmax(tf.cast(scores, tf.float32) + bias, axis=-1)
        # A query with no key in reach gets zeros, as torch's SDPA (transformers 5's default) gives it.
        probs *= tf.cast(tf.reduce_max(bias, axis=-1, keepdims=True) == 0.0, tf.float32)
        probs = self.drop(tf.cast(probs, v.dtype), training=training)
        out = tf.reshape(tf.einsum("bhqk,bkhd->bqhd", probs, v), [batch, length, self.heads * self.head_dim])
        return self.out_drop(self.Wo(out), training=training)


class MLP(tf_keras.layers.Layer):
    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(**kwargs)
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.Wi = _dense(2 * config.intermediate_size, config.mlp_bias, config.initializer_range, "Wi")
        self.Wo = _dense(config.hidden_size, config.mlp_bias, out_std, "Wo")
        self.drop = tf_keras.layers.Dropout(config.mlp_dropout)

    def call(self, x: Any, training: bool = False) -> Any:
        inputs, gate = tf.split(self.Wi(x), 2, axis=-1)
        return self.Wo(self.drop(tf.nn.gelu(inputs, approximate=False) * gate, training=training))


class EncoderLayer(tf_keras.layers.Layer):
    def __init__(self, config: Any, index: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.attn_norm = Norm(config, name="attn_norm") if index else None  # layer 0: Identity in torch
        self.attn = Attention(config, name="attn")
        self.mlp_norm = Norm(config, name="mlp_norm")
        self.mlp = MLP(config, name="mlp")
        self.kind = layer_types(config)[index]

    def call(self, x: Any, bias: Any, cos: Any, sin: Any, training: bool = False) -> Any:
        x = x + self.attn(self.attn_norm(x) if self.attn_norm else x, bias, cos, sin, training=training)
        return x + self.mlp(self.mlp_norm(x), training=training)


class ModernBertMaskedLM(tf_keras.Model):
    """`encode` and `lm_logits` apart, so the train step can run the head at the masked positions only."""

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(name="modernbert_for_masked_lm", **kwargs)
        self.config = config
        h = config.hidden_size
        self.tok_embeddings = tf_keras.layers.Embedding(
            config.vocab_size, h, embeddings_initializer=_init(config.initializer_range), name="tok_embeddings"
        )
        self.embed_norm = Norm(config, name="embed_norm")
        self.embed_drop = tf_keras.layers.Dropout(config.embedding_dropout)
        self.blocks = [EncoderLayer(config, i, name=f"layer_{i}") for i in range(config.num_hidden_layers)]
        self.final_norm = Norm(config, name="final_norm")
        out_std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        self.head_dense = _dense(h, config.classifier_bias, out_std, "head_dense")
        self.head_norm = Norm(config, name="head_norm")
        self.decoder_bias = (
            self.add_weight("decoder_bias", (config.vocab_size,), initializer="zeros") if config.decoder_bias else None
        )

    def encode(self, input_ids: Any, attention_mask: Any = None, training: bool = False) -> Any:
        """The final norm's output [batch, length, hidden]."""
        c = self.config
        length = tf.shape(input_ids)[1]
        biases = attention_biases(tf.ones_like(input_ids) if attention_mask is None else attention_mask, c)
        head_dim = c.hidden_size // c.num_attention_heads
        ropes = {GLOBAL: rope(length, head_dim, c.global_rope_theta), LOCAL: rope(length, head_dim, c.local_rope_theta)}
        x = self.embed_drop(self.embed_norm(self.tok_embeddings(input_ids)), training=training)
        for block in self.blocks:
            x = block(x, biases[block.kind], *ropes[block.kind], training=training)
        return self.final_norm(x)

    def lm_logits(self, hidden: Any) -> Any:
        """Head and tied decoder on any [..., hidden]: logits [..., vocab] in the compute dtype."""
        x = self.head_norm(tf.nn.gelu(self.head_dense(hidden), approximate=False))
        logits = tf.matmul(x, tf.cast(self.tok_embeddings.embeddings, x.dtype), transpose_b=True)
        return logits + tf.cast(self.decoder_bias, x.dtype) if self.decoder_bias is not None else logits

    def call(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, training: bool = False
    ) -> Any:
        """`.logits` at every position, as transformers' TF models answer (its fill-mask pipeline runs this)."""
        from transformers.modeling_tf_outputs import TFMaskedLMOutput

        return TFMaskedLMOutput(logits=self.lm_logits(self.encode(input_ids, attention_mask, training=training)))


class ModernBertClassifier(ModernBertMaskedLM):
    """transformers' ModernBertForSequenceClassification: the [CLS] (or mean) vector through the masked LM's
    head (no decoder), dropout and a new classifier."""

    def __init__(self, config: Any, num_labels: int, **kwargs: Any):
        super().__init__(config.__class__.from_dict({**config.to_dict(), "decoder_bias": False}), **kwargs)
        self.classifier = _dense(num_labels, config.classifier_bias, config.hidden_size**-0.5, "classifier")
        self.classifier_drop = tf_keras.layers.Dropout(config.classifier_dropout)

    def call(
        self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, training: bool = False
    ) -> Any:
        from transformers.modeling_tf_outputs import TFSequenceClassifierOutput

        mask = tf.ones_like(input_ids) if attention_mask is None else attention_mask
        hidden = self.encode(input_ids, mask, training=training)
        if self.config.classifier_pooling == "mean":
            weights = tf.cast(mask, hidden.dtype)[..., None]
            pooled = tf.reduce_sum(hidden * weights, axis=1) / tf.reduce_sum(weights, axis=1)
        else:
            pooled = hidden[:, 0]
        pooled = self.head_norm(tf.nn.gelu(self.head_dense(pooled), approximate=False))
        return TFSequenceClassifierOutput(logits=self.classifier(self.classifier_drop(pooled, training=training)))


def build_modernbert(config: Any, num_labels: int | None = None) -> ModernBertMaskedLM:
    """A freshly initialised model (with `num_labels`: a classifier), its variables created."""
    model = ModernBertMaskedLM(config) if num_labels is None else ModernBertClassifier(config, num_labels)
    dummy = tf.ones((1, 8), dtype=tf.int32) * 5
    model(dummy, tf.ones_like(dummy), training=False)
    return model


def load_modernbert(folder: str, num_labels: int | None = None, pretrained: bool = True) -> Any:
    """The model in a folder of config.json + model.safetensors; with `num_labels` a ModernBertClassifier on
    its encoder and head (`pretrained=False`: random weights)."""
    model = build_modernbert(read_config(os.path.join(folder, "config.json")), num_labels)
    if pretrained:
        path = os.path.join(folder, SAFETENSORS_NAME)
        tensors = read_safetensors(path)
        if num_labels is not None:  # the classifier has no decoder: the LM's own weights are left out
            tensors = {k: v for k, v in tensors.items() if k in parameters(model)}
        assign_modernbert(model, tensors, path)
    return model
