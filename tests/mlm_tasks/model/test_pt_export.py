"""The saved model loads in PyTorch with transformers 5.x (no TensorFlow there) and predicts what the
TensorFlow model predicts. The model is trained and saved by the real train step (which runs the LM
head at masked positions only); the PyTorch side runs in its own env (.venv-pt, `make env-pt`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.model.pt_export import expected_shapes, read_tf_weights, to_pytorch

ROOT = Path(__file__).resolve().parents[3]
PT_SCRIPT = ROOT / "tests" / "peers" / "pt_fill_mask.py"


def _folder(run) -> Path:
    return Path(storage.local_path(run.model))


def test_saved_folder_holds_roberta_for_masked_lm_weights_in_pytorch_layout(tiny_model):
    import h5py
    from safetensors import safe_open

    _, run = tiny_model
    folder = _folder(run)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["RobertaForMaskedLM"] and config["model_type"] == "roberta"
    assert (folder / "tf_model.h5").exists()  # TensorFlow clients keep their file

    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        pt = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118  (safe_open is no dict)
    assert {k: v.shape for k, v in pt.items()} == expected_shapes(config)
    assert all(v.dtype == np.float32 for v in pt.values())
    # Tied, as RobertaForMaskedLM ties them: the decoder is the word-embedding matrix, its bias lm_head.bias.
    np.testing.assert_array_equal(pt["lm_head.decoder.weight"], pt["roberta.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(pt["lm_head.decoder.bias"], pt["lm_head.bias"])

    # Against the h5 read independently of pt_export: Dense kernels transposed, the rest as they are.
    raw = {}

    def keep(name, obj):  # visititems stops at the first callback that returns something
        if hasattr(obj, "shape"):
            raw[name.split("/", 2)[2]] = obj[()]

    with h5py.File(folder / "tf_model.h5") as h5:
        h5.visititems(keep)
    q = raw["roberta/encoder/layer_._1/attention/self/query/kernel:0"]
    assert q.shape[0] != config["intermediate_size"]
    np.testing.assert_array_equal(pt["roberta.encoder.layer.1.attention.self.query.weight"], q.T)
    np.testing.assert_array_equal(
        pt["roberta.encoder.layer.0.intermediate.dense.weight"],
        raw["roberta/encoder/layer_._0/intermediate/dense/kernel:0"].T,
    )
    np.testing.assert_array_equal(pt["lm_head.layer_norm.weight"], raw["lm_head/layer_norm/gamma:0"])
    np.testing.assert_array_equal(
        pt["roberta.embeddings.position_embeddings.weight"], raw["roberta/embeddings/position_embeddings/embeddings:0"]
    )
    # And the weights carry training, not a fresh initialisation: the h5 is the trained model.
    assert not np.allclose(pt["lm_head.bias"], 0)


def test_transformers_5_loads_the_folder_and_predicts_what_tensorflow_predicts(tiny_model, pt_python):
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.fill_mask import fill_mask
    from peers.model_clients import run_in

    cfg, run = tiny_model
    cfg = cfg.model_copy(update={"infer": cfg.infer.model_copy(update={"top_k": 5})})
    # The project's own fill_mask step: pipeline(framework="tf").
    tf_side = fill_mask(cfg, RunContext.of(cfg, run.run_id))

    done = run_in(pt_python, PT_SCRIPT.read_text(), str(_folder(run)), "5", *cfg.infer.probes)
    assert done.returncode == 0, done.stderr[-4000:]
    pt_side = json.loads(done.stdout.strip().splitlines()[-1])
    assert pt_side["transformers"].startswith("5.") and pt_side["model_class"] == "RobertaForMaskedLM"
    info = pt_side["loading_info"]
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info
    assert pt_side["decoder_tied"] is True
    assert set(pt_side["parameters"]) >= set(expected_shapes(json.loads((_folder(run) / "config.json").read_text())))

    assert len(pt_side["predictions"]) == len(tf_side) == len(cfg.infer.probes)
    for tf_probe, pt_probe in zip(tf_side, pt_side["predictions"], strict=False):
        tf_top = [(p["token_str"], p["score"]) for p in tf_probe["predictions"]]
        pt_top = [(p["token_str"], p["score"]) for p in pt_probe["predictions"]]
        assert [t for t, _ in pt_top] == [t for t, _ in tf_top], (tf_probe["probe"], tf_top, pt_top)
        np.testing.assert_allclose([s for _, s in pt_top], [s for _, s in tf_top], atol=1e-4, err_msg=tf_probe["probe"])
    # A trained model, not a near-uniform one where any order would pass: its answers stand out from
    # uniform, and the top-5 scores differ by far more than the tolerance.
    vocab = json.loads((_folder(run) / "config.json").read_text())["vocab_size"]
    assert max(p["predictions"][0]["score"] for p in tf_side) > 3 / vocab
    assert max(p["predictions"][0]["score"] - p["predictions"][-1]["score"] for p in tf_side) > 1e-3


def test_weights_that_are_not_roberta_masked_lm_are_refused(tiny_model):
    _, run = tiny_model
    folder = _folder(run)
    config = json.loads((folder / "config.json").read_text())
    weights = read_tf_weights(str(folder / "tf_model.h5"))
    with pytest.raises(ValueError, match="do not map onto RobertaForMaskedLM"):
        to_pytorch({**weights, "roberta/pooler/dense/kernel": np.zeros((4, 4), np.float32)}, config)
    with pytest.raises(ValueError, match="do not map onto RobertaForMaskedLM"):
        to_pytorch(weights, {**config, "num_hidden_layers": config["num_hidden_layers"] + 1})
    with pytest.raises(ValueError, match="Unknown TensorFlow weight"):
        to_pytorch({**weights, "lm_head/dense/moving_mean": np.zeros(4, np.float32)}, config)


def test_the_training_environment_needs_no_torch():
    import importlib.util

    pinned = [
        line.split("==")[0]
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line and not line.startswith((" ", "#"))
    ]
    assert "torch" not in pinned and importlib.util.find_spec("torch") is None
