"""Start a built model from a base model's weights (`model.init_from`), TensorFlow or PyTorch layout, without torch.

    source = load_base_weights(model, folder)   # folder: config.json + tf_model.h5 or model.safetensors

Reads `tf_model.h5` (Keras' h5 groups), `model.safetensors` with TensorFlow names (`roberta/encoder/...`)
or with PyTorch names (`roberta.encoder....`: most Hub checkpoints, and mlm_tasks/model/pt_export.py's):
those with safetensors.numpy, each name found with pt_export's own mapping, Dense kernels transposed
back. Why by hand: transformers 4.57 cannot do this without torch (`TypeError: 'builtins.safe_open'
object is not iterable`). Every variable must be found with its shape; names the model lacks (a pooler,
a tied `lm_head.decoder.*` copy, `position_ids`) are left out; a shortfall is a ConfigError listing a few.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from mlm_tasks.errors import ConfigError
from mlm_tasks.model.pt_export import pt_name, read_tf_weights

log = logging.getLogger(__name__)


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


def base_weights(folder: str) -> tuple[str, dict[str, np.ndarray], bool]:
    """(file read, its arrays by name, whether the names are PyTorch's)."""
    h5 = os.path.join(folder, "tf_model.h5")
    if os.path.exists(h5):
        return "tf_model.h5", read_tf_weights(h5), False
    weights = read_safetensors(os.path.join(folder, "model.safetensors"))
    pytorch = not any("/" in name for name in weights)
    if not pytorch:
        weights = {tf_name(k): v for k, v in weights.items()}
    return "model.safetensors", weights, pytorch


def load_base_weights(model, folder: str) -> str:
    """Assign every variable of `model` (built: its variables exist) from the base in `folder`; returns a
    line saying what was read."""
    if model.config.model_type == "modernbert":  # the Keras ModernBERT: PyTorch names only
        from mlm_tasks.model.modernbert_weights import assign_weights

        path = os.path.join(folder, "model.safetensors")
        return assign_weights(model, read_safetensors(path), path)
    source, weights, pytorch = base_weights(folder)
    values, missing, mismatched = [], [], []
    for variable in model.weights:
        name = tf_name(variable.name)
        key, transpose = pt_name(name) if pytorch else (name, False)
        if key not in weights:
            missing.append(key)
            continue
        value = weights[key].T if transpose else weights[key]
        if tuple(value.shape) != tuple(variable.shape):
            mismatched.append(f"{key} {tuple(value.shape)} (model {tuple(variable.shape)})")
            continue
        values.append((variable, value))
    if missing or mismatched:
        raise ConfigError(
            f"The weights in {os.path.join(folder, source)} do not fit a RoBERTa masked LM of its "
            f"config.json: {len(missing)} missing (e.g. {missing[:3]}), {len(mismatched)} of another "
            f"shape (e.g. {mismatched[:3]}). Give a RobertaForMaskedLM checkpoint (with its lm_head)."
        )
    for variable, value in values:
        variable.assign(value.astype(variable.dtype.as_numpy_dtype))
    layout = "PyTorch" if pytorch else "TensorFlow"
    return f"{len(values)} tensors from {source} ({layout} names)"
