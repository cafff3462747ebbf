"""ModernBERT's config.json and model.safetensors as transformers 5 loads them, both ways, without torch.

save_modernbert(model, folder)                 # config.json + model.safetensors (PyTorch names)
read = assign_modernbert(model, tensors, where)   # into a built Keras model (model.init_from, load_modernbert)
"""

from __future__ import annotations

import json
import os
from operator import attrgetter
from typing import Any

import numpy as np

from mlm_tasks.errors import ConfigError
from mlm_tasks.model.pt_export import SAFETENSORS_NAME, assign_weights

ARCHITECTURE = "ModernBertForMaskedLM"
TIED = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers 5's layer_types


def layer_types(config: Any) -> list[str]:
    every = config.global_attn_every_n_layers
    return [LOCAL if i % every else GLOBAL for i in range(config.num_hidden_layers)]


def modernbert_config(values: dict) -> Any:
    """transformers (4.57)'s ModernBertConfig from a config.json of either line (4.x or 5.x keys)."""
    from transformers import ModernBertConfig

    types, rope = values.get("layer_types"), values.get("rope_parameters") or {}
    known = {k: v for k, v in values.items() if k not in ("layer_types", "rope_parameters", "transformers_version")}
    for key, kind in (("global_rope_theta", GLOBAL), ("local_rope_theta", LOCAL)):
        if "rope_theta" in (rope.get(kind) or {}):
            known[key] = float(rope[kind]["rope_theta"])
    if types is not None:  # a global layer every N: 0, N, 2N, ...
        known["global_attn_every_n_layers"] = next((i for i, t in enumerate(types) if i and t == GLOBAL), len(types))
    config = ModernBertConfig.from_dict(known)
    if types is not None and layer_types(config) != list(types):
        raise ConfigError(
            f"layer_types {types} is not a global layer every N layers (0, N, 2N, ...): this project's "
            "ModernBERT takes that pattern only."
        )
    return config


def read_config(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return modernbert_config(json.load(f))


def config_json(config: Any) -> dict:
    """config.json as transformers 5 reads it (and 4.x: its keys are there too): every argument of 4.57's
    ModernBertConfig (5.24's fields, with the pattern and RoPE bases in 4.x's spelling) and 5.x's own."""
    import inspect

    skip = ("self", "kwargs", "reference_compile", "repad_logits_with_grad")  # 4.x's, not model settings
    keys = [k for k in inspect.signature(type(config).__init__).parameters if k not in skip]
    values = {key: getattr(config, key) for key in [*keys, "tie_word_embeddings"]}
    values.update(model_type="modernbert", architectures=[ARCHITECTURE], layer_types=layer_types(config))
    values["rope_parameters"] = {
        GLOBAL: {"rope_type": "default", "rope_theta": float(config.global_rope_theta)},
        LOCAL: {"rope_type": "default", "rope_theta": float(config.local_rope_theta)},
    }
    return values


def parameters(model: Any) -> dict[str, tuple[Any, bool]]:
    """Every variable of a built ModernBertMaskedLM by its PyTorch name: (variable, transposed?)."""
    table = {"model.embeddings.tok_embeddings.weight": (model.tok_embeddings.embeddings, False)}

    def add(prefix: str, layer: Any) -> None:  # a Dense (its kernel transposed) or a Norm, and its bias if any
        dense = hasattr(layer, "kernel")
        table[f"{prefix}.weight"] = (layer.kernel if dense else layer.weight, dense)
        if layer.bias is not None:
            table[f"{prefix}.bias"] = (layer.bias, False)

    add("model.embeddings.norm", model.embed_norm)
    for i, block in enumerate(model.blocks):
        for name in ("attn_norm", "attn.Wqkv", "attn.Wo", "mlp_norm", "mlp.Wi", "mlp.Wo"):  # the Keras attributes
            layer = attrgetter(name)(block)
            if layer is not None:  # layer 0 has no attn_norm (torch's Identity)
                add(f"model.layers.{i}.{name}", layer)
    add("model.final_norm", model.final_norm)
    add("head.dense", model.head_dense)
    add("head.norm", model.head_norm)
    if model.decoder_bias is not None:
        table["decoder.bias"] = (model.decoder_bias, False)
    return table


def save_modernbert(model: Any, folder: str) -> str:
    """Write config.json and model.safetensors (ModernBertForMaskedLM's state dict in fp32, the tied decoder weight
    included; metadata format=pt) into `folder`; returns the weights' path."""
    from safetensors.numpy import save_file

    tensors = {
        name: np.ascontiguousarray(np.asarray(var.numpy(), np.float32).T if transpose else var.numpy(), np.float32)
        for name, (var, transpose) in parameters(model).items()
    }
    for tied, source in TIED.items():
        tensors[tied] = tensors[source].copy()  # safetensors stores no aliases
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config_json(model.config), f, indent=2, sort_keys=True)
    path = os.path.join(folder, SAFETENSORS_NAME)
    save_file(tensors, path + ".partial", metadata={"format": "pt"})
    os.replace(path + ".partial", path)
    return path


def assign_modernbert(model: Any, tensors: dict[str, np.ndarray], where: str) -> str:
    """Assign every variable of a built `model` from `tensors` (PyTorch names); returns a line saying what was read."""
    table = parameters(model)
    unknown = sorted(set(tensors) - set(table) - set(TIED))
    count = assign_weights(table, tensors, where, ARCHITECTURE, f"Give a {ARCHITECTURE} checkpoint.", unknown)
    return f"{count} tensors from {os.path.basename(where)} (PyTorch names)"
