"""RoBERTa weights between TensorFlow's and PyTorch's names and layouts, with numpy (no torch: transformers 4.57
cannot read safetensors without it either; docs/releases.md#interoperability).

    export_pytorch_weights(folder)           # tf_model.h5 + config.json -> model.safetensors, PyTorch names
    read = load_roberta_weights(model, folder)   # model.init_from: tf_model.h5, or model.safetensors of either naming
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from mlm_tasks.errors import ConfigError

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
    """Keras' h5 layout by name, without the model's scope and `:0` (the shared word embeddings read once)."""
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
    """`roberta/encoder/layer_._3/.../query/kernel` -> (`roberta.encoder.layer.3.attention.self.query.weight`, True)."""
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
    square = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
    layer = {**dict.fromkeys(square, (h, h)), "intermediate.dense": (ffn, h), "output.dense": (h, ffn)}
    for i in range(config["num_hidden_layers"]):
        p = f"roberta.encoder.layer.{i}."
        for dense, (out_dim, in_dim) in layer.items():
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
    """Write `model.safetensors` (PyTorch names) into a local model folder, config.json naming the PyTorch class."""
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


def tf_name(variable_name: str) -> str:
    """`tf_roberta_for_masked_lm/roberta/embeddings/word_embeddings/weight:0` -> `roberta/embeddings/...`:
    the model's own scope (numbered when several models were built) and the `:0` go."""
    name = variable_name.rsplit(":", 1)[0]
    first, _, rest = name.partition("/")
    return rest if rest and first not in ("roberta", "lm_head") else name


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (SafetensorError, TypeError, ValueError) as err:  # TypeError: a dtype numpy lacks (bfloat16)
        raise ConfigError(
            f"Cannot read {path} ({type(err).__name__}: {err}): give float32 or float16 weights "
            "(bfloat16 has no numpy type), or a folder with tf_model.h5."
        ) from None


def assign_weights(
    table: dict[str, tuple[Any, bool]],
    tensors: dict[str, np.ndarray],
    where: str,
    model_class: str,
    advice: str,
    unknown: list[str] | None = None,
) -> int:
    """Assign each variable of `table` ({name: (variable, transposed?)}) from `tensors`, all or none: a
    ConfigError names what is missing, of another shape or (`unknown`) left over. Returns the count."""
    values, missing, mismatched = [], [], []
    for name, (variable, transpose) in table.items():
        if name not in tensors:
            missing.append(name)
            continue
        value = tensors[name].T if transpose else tensors[name]
        if tuple(value.shape) != tuple(variable.shape):
            mismatched.append(f"{name} {tuple(value.shape)} (model {tuple(variable.shape)})")
            continue
        values.append((variable, value))
    found = f"{len(missing)} missing (e.g. {missing[:3]}), {len(mismatched)} of another shape (e.g. {mismatched[:3]})"
    if unknown is not None:
        found += f", {len(unknown)} unknown (e.g. {unknown[:3]})"
    if missing or mismatched or unknown:
        raise ConfigError(f"The weights in {where} do not fit a {model_class} of its config.json: {found}. {advice}")
    for variable, value in values:
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))
    return len(values)


def load_roberta_weights(model: Any, folder: str) -> str:
    """Assign every variable of a built RoBERTa from the base in `folder` (tf_model.h5 preferred; names the model
    lacks, such as a pooler, are left out); returns a line saying what was read."""
    if os.path.exists(os.path.join(folder, "tf_model.h5")):
        source, weights, pytorch = "tf_model.h5", read_tf_weights(os.path.join(folder, "tf_model.h5")), False
    else:
        source, weights = SAFETENSORS_NAME, read_safetensors(os.path.join(folder, SAFETENSORS_NAME))
        pytorch = not any("/" in name for name in weights)
        if not pytorch:
            weights = {tf_name(k): v for k, v in weights.items()}
    table = {}
    for variable in model.weights:
        name = tf_name(variable.name)
        key, transpose = pt_name(name) if pytorch else (name, False)
        table[key] = (variable, transpose)
    where, advice = os.path.join(folder, source), "Give a RobertaForMaskedLM checkpoint (with its lm_head)."
    count = assign_weights(table, weights, where, "RoBERTa masked LM", advice)
    return f"{count} tensors from {source} ({'PyTorch' if pytorch else 'TensorFlow'} names)"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
