"""Continued pretraining (`model.init_from`): a run starts from a base model's weights and tokenizer, read
from a local folder (TensorFlow or PyTorch layout) or from the Hub peer serving a model this project
published, and validate refuses settings that contradict the base.

The base is a tiny model trained here by the real train step on the tiny data set; the continued runs
encode the same corpus with its tokenizer, so their shards are the base's own, byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunContext, RunPaths
from peers.tiny_data import tiny_config

BASE_STEPS = 80  # the base learns enough that its loss is far below an untrained model's
FIRST_LOSS_MARGIN = 0.5  # nats (perplexity x1.65); the base after 80 steps is ~1.0 below a fresh model
HUB_REPO = "test-org/tiny-base"


def _train(cfg, run_id: str, fingerprint: str, steps: int, **train):
    from mlm_tasks.steps.train import train as train_step

    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": steps, "log_every": 1, **train})})
    return train_step(cfg, RunContext.of(cfg, run_id, fingerprint))


@pytest.fixture(scope="module")
def base(tiny_prepared):
    """(cfg, data summary, folder) of the base model: tiny, trained BASE_STEPS, saved as train saves it."""
    cfg, data = tiny_prepared
    _train(cfg, "init-from-base", data["fingerprint"], BASE_STEPS, learning_rate=3e-3)
    return cfg, data, Path(storage.local_path(RunPaths(cfg.output_root, "init-from-base").model))


@pytest.fixture(scope="module")
def scratch_first_loss(base):
    """The first logged loss of a run from random weights on the base's own shards."""
    cfg, data, _ = base
    return _train(cfg, "init-from-scratch", data["fingerprint"], 2)["first_loss"]


def _continued(tmp_path, init_from: str, **overrides):
    return tiny_config(tmp_path / "out", **{"model.init_from": init_from, **overrides})


def _pytorch_only(folder: Path, dest: Path) -> Path:
    """The base as most Hub checkpoints ship: config, tokenizer and a PyTorch-layout model.safetensors."""
    dest.mkdir()
    for f in folder.iterdir():
        if f.name != "tf_model.h5":
            shutil.copy(f, dest / f.name)
    return dest


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_continued_run_starts_from_the_base_weights_and_tokenizer(base, scratch_first_loss, tmp_path, caplog):
    from mlm_tasks.data.shard_set import data_fingerprint
    from mlm_tasks.reporting.card import write_model_card
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.validate import validate

    base_cfg, base_data, folder = base
    cfg = _continued(tmp_path, str(folder), **{"train.learning_rate": 2e-4, "train.warmup_fraction": 0.5})
    validate(cfg)
    caplog.set_level("INFO", logger="mlm_tasks")
    data = build_shard_set(cfg)

    # No tokenizer trained: the base's encodes the shards, and the data is keyed by the base too.
    assert "no tokenizer is trained" in caplog.text and "Trained a unigram tokenizer" not in caplog.text
    tokenizer = json.loads((Path(data["tokenizer_uri"]) / "tokenizer.json").read_text())
    assert tokenizer["model"] == json.loads((folder / "tokenizer.json").read_text())["model"]
    assert data["fingerprint"] not in (base_data["fingerprint"], data_fingerprint(base_cfg))
    assert data["base_model"]["init_from"] == str(folder) and data["base_model"]["revision"].startswith("sha256:")
    assert data["base_model"]["hidden_size"] == 64
    shas = lambda d: [s["sha256"] for s in storage.read_json(d["manifest_uri"])["splits"]["train"]["shards"]]  # noqa: E731
    assert shas(data) == shas(base_data)  # the same ids as the base's own shards

    summary = _train(cfg, "continued", data["fingerprint"], 4)
    assert f"Starting from the base model {folder}" in caplog.text and "(TensorFlow names)" in caplog.text
    assert summary["first_loss"] < scratch_first_loss - FIRST_LOSS_MARGIN, (summary, scratch_first_loss)
    # Warmup and learning rate are the run's own: 4 steps, half of them warming up to 2e-4.
    history = [
        json.loads(x) for x in storage.read_text(RunPaths(cfg.output_root, "continued").train_history).splitlines()
    ]
    assert max(h["learning_rate"] for h in history) <= 2e-4 + 1e-9

    card = Path(write_model_card(cfg, RunPaths(cfg.output_root, "continued"), data)).read_text()
    assert f"pretraining continued from `{folder}`" in card and data["base_model"]["revision"][7:] in card
    assert "Tokenizer: the base model's" in card and "base_model:" not in card  # a folder, not a Hub id


@pytest.mark.slow  # needs the trained base: ~25 s: in make test, not in make test-fast
def test_pytorch_and_tensorflow_safetensors_load_the_same_weights_as_the_h5(base, tmp_path):
    import tensorflow as tf
    from transformers import TFRobertaForMaskedLM

    from mlm_tasks.base_model import BaseModelRef
    from mlm_tasks.model.pt_export import read_tf_weights
    from mlm_tasks.model.roberta import build_model, load_base_weights, model_config
    from mlm_tasks.steps.validate import validate

    _, _, folder = base
    pt_folder = _pytorch_only(folder, tmp_path / "pt")
    tf_folder = tmp_path / "tf-safetensors"
    TFRobertaForMaskedLM.from_pretrained(folder, use_safetensors=False).save_pretrained(
        tf_folder, safe_serialization=True
    )  # TensorFlow names, metadata format=tf
    (tf_folder / "tf_model.h5").unlink(missing_ok=True)
    shutil.copy(folder / "tokenizer.json", tf_folder)
    expected = read_tf_weights(str(folder / "tf_model.h5"))

    for source, layout in ((pt_folder, "PyTorch"), (tf_folder, "TensorFlow")):
        cfg = _continued(tmp_path / source.name, str(source))
        validate(cfg)
        b = BaseModelRef.of(cfg)
        assert b.weights_file == "model.safetensors"
        model = build_model(model_config(cfg, 0, {}, b.config()))
        assert load_base_weights(model, b.local_folder(str(tmp_path / "x"))).endswith(f"({layout} names)")
        for variable in model.weights:
            name = variable.name.split("/", 1)[1].rsplit(":", 1)[0]
            np.testing.assert_array_equal(variable.numpy(), expected[name], err_msg=f"{layout}: {name}")
        tf.keras.backend.clear_session()


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_the_hub_peer_serves_a_published_model_at_a_pinned_revision(
    base, scratch_first_loss, fake_hub, tmp_path, monkeypatch
):
    from huggingface_hub import HfApi

    from mlm_tasks.reporting.card import write_model_card
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.publish import publish
    from mlm_tasks.steps.validate import validate

    base_cfg, base_data, _ = base
    pub = base_cfg.model_copy(update={"publish": base_cfg.publish.model_copy(update={"repo_id": HUB_REPO})})
    first = publish(
        pub, RunContext.of(pub, "init-from-base", base_data["fingerprint"]), token=fake_hub.token, data_info=base_data
    )["commit_oid"]
    # A later commit breaks the weights on main: the run must read the revision it pinned.
    HfApi(endpoint=fake_hub.url, token=fake_hub.token).upload_file(
        path_or_fileobj=b"not weights", path_in_repo="tf_model.h5", repo_id=HUB_REPO
    )
    assert fake_hub.repos[HUB_REPO].private and fake_hub.repos[HUB_REPO].sha != first

    cfg = _continued(tmp_path, HUB_REPO, **{"model.init_revision": "main"})
    with pytest.raises(ConfigError, match=f"no model repo {HUB_REPO}.*or it is private.*HF_TOKEN"):
        validate(cfg)  # private, and no token yet
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    with pytest.raises(ConfigError, match="init_revision 'v9' is not a branch, tag or commit"):
        validate(_continued(tmp_path, HUB_REPO, **{"model.init_revision": "v9"}))

    cfg = _continued(tmp_path, HUB_REPO, **{"model.init_revision": first})
    validate(cfg)
    data = build_shard_set(cfg)
    assert data["base_model"]["revision"] == first and data["base_model"]["kind"] == "hub"
    summary = _train(cfg, "from-hub", data["fingerprint"], 2)
    assert summary["first_loss"] < scratch_first_loss - FIRST_LOSS_MARGIN, (summary, scratch_first_loss)
    downloads = {path for method, path, _ in fake_hub.requests if "/resolve/" in path and method == "GET"}
    assert f"/{HUB_REPO}/resolve/{first}/tf_model.h5" in downloads
    assert not any("/resolve/main/" in p for p in downloads)

    card = Path(write_model_card(cfg, RunPaths(cfg.output_root, "from-hub"), data)).read_text()
    assert f"base_model: {HUB_REPO}" in card and f"`{HUB_REPO}` (revision `{first}`)" in card


@pytest.mark.slow  # needs the trained base: ~25 s: in make test, not in make test-fast
def test_validate_refuses_what_contradicts_the_base(base, tmp_path):
    from mlm_tasks.config import build_config
    from mlm_tasks.data.shard_set import data_fingerprint
    from mlm_tasks.steps.validate import validate

    _, _, folder = base
    cases = {
        "model.hidden_size": (128, r"shape comes from the base model .*model.hidden_size=128 \(the base has 64\)"),
        "shards.max_length": (128, "max_length 128 does not fit the base model .* at most 64"),
        "model.init_revision": ("v1", "init_revision 'v1' is for a Hub repo"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            validate(_continued(tmp_path, str(folder), **{key: value}))
    with pytest.raises(ConfigError, match="neither an existing local folder, a gs:// folder, nor a Hub repo id"):
        validate(_continued(tmp_path, str(tmp_path / "absent")))
    with pytest.raises(ConfigError, match="init_revision 'main' is set but model.init_from is empty"):
        build_config(overrides={"model.init_revision": "main"})
    with pytest.raises(ConfigError, match="corpus.source=tfrecord_shards brings shards already encoded"):
        build_config(overrides={"model.init_from": str(folder), "corpus.source": "tfrecord_shards"})

    bert = _pytorch_only(folder, tmp_path / "bert")
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(ConfigError, match="is a 'bert' model, but model.architecture is roberta"):
        validate(_continued(tmp_path, str(bert)))
    (bert / "config.json").write_text(json.dumps(config))
    # Another base (other files) is other data: its shard set never mixes with this one's.
    assert data_fingerprint(_continued(tmp_path, str(bert))) != data_fingerprint(_continued(tmp_path, str(folder)))
    (bert / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="has neither tf_model.h5 nor model.safetensors"):
        validate(_continued(tmp_path, str(bert)))
