"""PyTorch-layout weights for a saved model: `model.safetensors` beside `tf_model.h5`, without torch.

    export_pytorch_weights(folder)   # folder holds tf_model.h5 + config.json; writes model.safetensors

Why: transformers 5.x has no TensorFlow and loads `RobertaForMaskedLM`'s parameter names; TensorFlow's
`save_pretrained(safe_serialization=True)` writes TensorFlow names, which 5.x loads as a randomly
initialised model with only a warning. So the weights are renamed and laid out here with numpy (Dense
kernels [in, out] in Keras, [out, in] in torch), read from `tf_model.h5` itself: the export is a
function of the artifact, and the training image needs neither torch nor TensorFlow for it. Every
parameter is written, tied ones too. docs/releases.md#interoperability
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

SAFETENSORS_NAME = "model.safetensors"
ARCHITECTURE = "RobertaForMaskedLM"


# The last part of a Keras variable name -> (PyTorch parameter name, transpose?).
_LEAF = {
    "kernel": ("weight", True),
    "gamma": ("weight", False),
    "beta": ("bias", False),
    "embeddings": ("weight", False),
    "weight": ("weight", False),
    "bias": ("bias", False),
}


_TIED = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight", "lm_head.decoder.bias": "lm_head.bias"}


def read_tf_weights(h5_path: str) -> dict[str, np.ndarray]:
    """Keras' h5 layout: one group per layer, its `weight_names` attribute listing datasets under it.
    Names lose the model's own scope (`tf_roberta_for_masked_lm[_N]/`) and the `:0` suffix; the word
    embeddings are stored under both layers that use them, and are read once."""
    import h5py

    out: dict[str, np.ndarray] = {}
    with h5py.File(h5_path, "r") as f:
        for layer in f.attrs["layer_names"]:
            group = f[_text(layer)]
            for weight in group.attrs["weight_names"]:
                full = _text(weight)
                name = full.split("/", 1)[1].rsplit(":", 1)[0]
                out.setdefault(name, np.asarray(group[full], dtype=np.float32))
    return out


def pt_name(tf_name: str) -> tuple[str, bool]:
    """`roberta/encoder/layer_._3/attention/self/query/kernel` -> (`roberta.encoder.layer.3.attention.
    self.query.weight`, True)."""
    *scope, leaf = re.sub(r"layer_\._(\d+)", r"layer.\1", tf_name).split("/")
    if leaf not in _LEAF:
        raise ValueError(f"Unknown TensorFlow weight {tf_name!r}: pt_export knows RoBERTa masked-LM weights only.")
    name, transpose = _LEAF[leaf]
    return ".".join([*scope, name]), transpose


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter of transformers' RobertaForMaskedLM (PyTorch) for this config.json, tied ones included."""
    h, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes = {
        "roberta.embeddings.word_embeddings.weight": (vocab, h),
        "roberta.embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "roberta.embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "roberta.embeddings.LayerNorm.weight": (h,),
        "roberta.embeddings.LayerNorm.bias": (h,),
        "lm_head.dense.weight": (h, h),
        "lm_head.dense.bias": (h,),
        "lm_head.layer_norm.weight": (h,),
        "lm_head.layer_norm.bias": (h,),
        "lm_head.bias": (vocab,),
        "lm_head.decoder.weight": (vocab, h),
        "lm_head.decoder.bias": (vocab,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"roberta.encoder.layer.{i}."
        for dense, (out_dim, in_dim) in {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (ffn, h),
            "output.dense": (h, ffn),
        }.items():
            shapes[f"{p}{dense}.weight"], shapes[f"{p}{dense}.bias"] = (out_dim, in_dim), (out_dim,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (h,)
    return shapes


def to_pytorch(tf_weights: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """Rename and lay out the weights; fails unless the result is exactly RobertaForMaskedLM's set."""
    out = {}
    for tf_name, value in tf_weights.items():
        name, transpose = pt_name(tf_name)
        out[name] = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
    for tied, source in _TIED.items():
        if source in out:
            out[tied] = out[source].copy()  # safetensors stores no aliases: a copy with the same values
    want = expected_shapes(config)
    got = {k: tuple(v.shape) for k, v in out.items()}
    if got != want:
        diff = sorted(set(want.items()) ^ set(got.items()))
        raise ValueError(
            f"The saved TensorFlow weights do not map onto RobertaForMaskedLM ({len(diff)} "
            f"names or shapes differ, e.g. {diff[:4]}): is this a RoBERTa masked-LM folder?"
        )
    return out


def export_pytorch_weights(folder: str) -> str:
    """Write `model.safetensors` (PyTorch names, metadata format=pt) into a local model folder and make
    config.json name the PyTorch class. Returns the file's path."""
    from safetensors.numpy import save_file

    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    tensors = to_pytorch(read_tf_weights(os.path.join(folder, "tf_model.h5")), config)
    path = os.path.join(folder, SAFETENSORS_NAME)
    # format=pt: transformers reads other formats (tf, flax) as weights to convert, not to load as they are.
    save_file(tensors, path + ".partial", metadata={"format": "pt"})
    os.replace(path + ".partial", path)
    if config.get("architectures") != [ARCHITECTURE]:
        config["architectures"] = [ARCHITECTURE]
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
    return path


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
