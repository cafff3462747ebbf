"""The Keras ModernBERT (model.architecture=modernbert): trained by the project's step, proven by transformers 5.

Both directions against the other client, in the PyTorch env (.venv-pt): the folder the train step saves loads
in `AutoModelForMaskedLM` with no missing or unexpected keys and gives the Keras model's logits and fill-mask
top-5; a ModernBERT made and saved by transformers 5 itself loads into the Keras model (model.init_from) with
transformers' logits, and continues pretraining. Batches carry padding, and sequences longer than the local
window, so the padding and the sliding window are both checked.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/model/test_modernbert.py -q -p no:xdist
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.paths import RunContext
from peers.model_clients import MODERNBERT, run_in
from peers.tiny_data import tiny_config

ROOT = Path(__file__).resolve().parents[3]
PT_MODERNBERT = ROOT / "tests" / "peers" / "pt_modernbert.py"
PT_FILL_MASK = ROOT / "tests" / "peers" / "pt_fill_mask.py"
TEXTS = [  # lengths from ~10 to ~40 tokens: padding, and sequences past the ±8-token window
    "The city is the capital of the country.",
    "In the years after the war the town grew quickly, and a railway station, two schools and a large "
    "market were built along the river, where the old bridge had stood.",
    "He was born in 1850.",
]


def _padded_batch(folder: Path, path: Path) -> dict[str, np.ndarray]:
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="np")
    batch = {k: encoded[k].astype(np.int32) for k in ("input_ids", "attention_mask")}
    assert batch["attention_mask"].min() == 0 and batch["input_ids"].shape[1] > 20  # padded, past the window
    np.savez(path, **batch)
    return batch


def _keras_logits(model, batch) -> np.ndarray:
    return model(batch["input_ids"], batch["attention_mask"]).logits.numpy()


def _pt_logits(pt_python: str, folder: Path, npz: Path) -> tuple[dict, np.ndarray]:
    done = run_in(pt_python, PT_MODERNBERT.read_text(), "logits", str(folder), str(npz))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(str(npz) + ".pt.npy")


def _fp32() -> None:
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


def test_the_head_at_masked_positions_only_gives_the_full_heads_loss(tiny_cfg):
    import tensorflow as tf

    from mlm_tasks.model.roberta import build_model, masked_lm_loss, model_config

    _fp32()
    cfg = tiny_config(tiny_cfg.output_root, **MODERNBERT)
    model = build_model(model_config(cfg, 300, {"pad": 1, "bos": 0, "eos": 2}))
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 300, (4, 24)).astype(np.int32)
    labels = np.where(rng.random((4, 24)) < 0.2, ids, -100).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 15:] = 0
    labels[1, 15:] = -100
    batch = {"input_ids": tf.constant(ids), "attention_mask": tf.constant(mask), "labels": tf.constant(labels)}
    full = [float(x) for x in masked_lm_loss(model, batch, 0, training=False)]
    assert full[1] == (labels != -100).sum() > 0
    for kwargs in ({"max_predictions": 12}, {"max_predictions": 12, "packed": True}):
        part = masked_lm_loss(model, batch, kwargs.pop("max_predictions"), training=False, **kwargs)
        np.testing.assert_allclose([float(x) for x in part], full, rtol=1e-5, err_msg=str(kwargs))


def test_modernbert_trains_under_the_step_xla_in_bf16_k_steps_a_call(tiny_modernbert):
    from safetensors import safe_open

    from mlm_tasks.model.modernbert import layer_types
    from mlm_tasks.model.modernbert_weights import read_config

    cfg, run, summary = tiny_modernbert
    assert (summary["xla"], summary["precision"], summary["steps_per_call"]) == (True, "bf16", 4)
    assert summary["last_loss"] < summary["first_loss"] - 0.3, summary
    folder = Path(storage.local_path(run.model))
    assert not (folder / "tf_model.h5").exists() and (folder / "tokenizer.json").exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert config["local_attention"] == 16 and config["intermediate_size"] == 96
    assert layer_types(read_config(str(folder / "config.json"))) == config["layer_types"]
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}  # noqa: SIM118
    h, vocab = config["hidden_size"], config["vocab_size"]
    assert shapes["model.layers.1.attn.Wqkv.weight"] == [3 * h, h]
    assert shapes["model.layers.2.mlp.Wi.weight"] == [2 * 96, h] and shapes["model.layers.2.mlp.Wo.weight"] == [h, 96]
    assert shapes["decoder.weight"] == [vocab, h] and shapes["decoder.bias"] == [vocab]
    assert "model.layers.0.attn_norm.weight" not in shapes and "model.layers.1.attn_norm.weight" in shapes
    assert not any(name.endswith(".bias") and name != "decoder.bias" for name in shapes)  # norm_bias=False


def test_transformers_5_loads_the_saved_folder_with_the_same_logits_and_fill_mask(tiny_modernbert, pt_python, tmp_path):
    from mlm_tasks.model.roberta import load_masked_lm
    from mlm_tasks.steps.fill_mask import fill_mask

    cfg, run, _ = tiny_modernbert
    folder = Path(storage.local_path(run.model))
    _fp32()
    batch = _padded_batch(folder, tmp_path / "batch.npz")
    keras = _keras_logits(load_masked_lm(str(folder)), batch)
    pt_side, pt = _pt_logits(pt_python, folder, tmp_path / "batch.npz")
    assert pt_side["transformers"].startswith("5.") and pt_side["model_class"] == "ModernBertForMaskedLM"
    info = pt_side["loading_info"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    assert pt_side["decoder_tied"] is True
    assert np.abs(keras - pt).max() <= 1e-3, np.abs(keras - pt).max()
    assert np.abs(keras).max() > 1.0  # logits of a trained model, not near-zero ones any difference would pass

    cfg = cfg.model_copy(update={"infer": cfg.infer.model_copy(update={"top_k": 5})})
    ours = fill_mask(cfg, RunContext.of(cfg, run.run_id))  # the project's step: pipeline(framework="tf")
    done = run_in(pt_python, PT_FILL_MASK.read_text(), str(folder), "5", *cfg.infer.probes)
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])["predictions"]
    for a, b in zip(ours, theirs, strict=True):
        assert [p["token_str"] for p in a["predictions"]] == [p["token_str"] for p in b["predictions"]], a["probe"]
        np.testing.assert_allclose(
            [p["score"] for p in a["predictions"]], [p["score"] for p in b["predictions"]], atol=1e-4
        )


def test_a_modernbert_saved_by_transformers_5_loads_into_keras_and_continues_pretraining(
    tiny_prepared, pt_python, tmp_path, caplog
):
    from tokenizers import Tokenizer

    from mlm_tasks.base_model import BaseModelRef
    from mlm_tasks.model.roberta import build_model, load_base_weights, model_config
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.train import train
    from mlm_tasks.steps.validate import validate

    data_cfg, data = tiny_prepared
    tokenizer_dir = Path(data["tokenizer_uri"])
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("<s>", "<pad>", "</s>")}
    shape = {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,  # configs/tiny.yaml's shape settings: a base must not contradict them
        "intermediate_size": 128,
        "max_position_embeddings": 66,
        "num_hidden_layers": 4,  # global, local, local, global
        "num_attention_heads": 2,
        "local_attention": 16,
        "pad_token_id": ids["<pad>"],
        **dict.fromkeys(("bos_token_id", "cls_token_id"), ids["<s>"]),
        **dict.fromkeys(("eos_token_id", "sep_token_id"), ids["</s>"]),
    }
    base = tmp_path / "pt-base"
    done = run_in(pt_python, PT_MODERNBERT.read_text(), "make", str(base), json.dumps(shape))
    assert done.returncode == 0, done.stderr[-4000:]
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, base / f.name)
    saved = json.loads((base / "config.json").read_text())
    assert "rope_parameters" in saved and "global_rope_theta" not in saved  # transformers 5's own spelling

    cfg = tiny_config(tmp_path / "out", **{"model.architecture": "modernbert", "model.init_from": str(base)})
    validate(cfg)
    _fp32()
    model = build_model(model_config(cfg, 0, {}, BaseModelRef.of(cfg).config()))
    assert load_base_weights(model, str(base)).endswith("(PyTorch names)")
    batch = _padded_batch(base, tmp_path / "batch.npz")
    _, pt = _pt_logits(pt_python, base, tmp_path / "batch.npz")
    assert np.abs(_keras_logits(model, batch) - pt).max() <= 1e-4

    caplog.set_level("INFO", logger="mlm_tasks")
    shards = build_shard_set(cfg)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 2, "log_every": 1})})
    summary = train(cfg, RunContext.of(cfg, "continued-modernbert", shards["fingerprint"]))
    assert f"Starting from the base model {base}" in caplog.text and summary["steps"] == 2


@pytest.mark.slow  # trains two models and builds two shard sets: ~4 min on 2 cores
def test_a_1024_token_extension_of_a_128_token_model_scores_lower_at_1024_tokens(tmp_path):
    from mlm_tasks.paths import RunPaths
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.evaluate import evaluate
    from mlm_tasks.steps.train import train

    out = tmp_path / "out"
    context = {"model.max_position_embeddings": None, "train.max_predictions_per_seq": 0}
    short = tiny_config(out, **MODERNBERT, **context, **{"shards.max_length": 128, "train.steps": 60})
    short = short.model_copy(update={"train": short.train.model_copy(update={"learning_rate": 3e-3})})
    short_data = build_shard_set(short)
    train(short, RunContext.of(short, "short", short_data["fingerprint"]))
    base = storage.local_path(RunPaths(short.output_root, "short").model)

    # The extension phase: the 128-token model on a 1,024-token shard set of the same corpus, its global RoPE
    # base raised as ModernBERT's was; the optimizer starts afresh (init_from reads the model, not its moments).
    extension = {"shards.max_length": 1024, "model.init_from": base, "model.rope_theta": 160_000.0}
    long = tiny_config(out, **MODERNBERT, **context, **extension, **{"train.steps": 20, "train.batch_size": 4})
    long_data = build_shard_set(long)
    train(long, RunContext.of(long, "extended", long_data["fingerprint"]))
    config = json.loads(
        (Path(storage.local_path(RunPaths(long.output_root, "extended").model)) / "config.json").read_text()
    )
    assert config["max_position_embeddings"] == 1024 and config["global_rope_theta"] == 160_000.0
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == 160_000.0
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0

    extended = evaluate(long, RunContext.of(long, "extended", long_data["fingerprint"]))
    unextended = evaluate(long, RunContext.of(long, "short", long_data["fingerprint"]))
    assert extended["masked_tokens"] == unextended["masked_tokens"] > 0  # the same 1,024-token batches
    assert extended["loss"] < unextended["loss"], (extended["loss"], unextended["loss"])
