"""Publishing with the real huggingface_hub client against the fake Hub on loopback: exactly which
files are committed, what the card says, the private flag, token errors, checkpoint sync."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import yaml

from mlm_tasks import paths, storage
from mlm_tasks.config import build_config
from mlm_tasks.errors import AuthError, ConfigError, MissingArtifactError, TransientError
from mlm_tasks.hub.sync import CheckpointSyncer
from mlm_tasks.paths import DataPaths, RunContext, join
from mlm_tasks.steps.publish import publish
from mlm_tasks.steps.publish_tokenizer import publish_tokenizer
from peers.run_artifacts import MODEL_FILES, make_run

REPO = "tester/roberta-wiki"


def _ctx(run) -> RunContext:
    return RunContext(run.output_root, run.run_id)


def _cfg(root, **publish):
    return build_config({"output_root": str(root), "publish": {"enabled": True, "repo_id": REPO, **publish}})


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_publish_commits_exactly_the_model_dir_and_its_card(tmp_path, fake_hub):
    cfg = _cfg(tmp_path)
    run = make_run(str(tmp_path), "run-1")
    # A concurrent writer's temporary file must not be published.
    storage.write_bytes(join(run.model, "config.json.tmp-1a2b3c4d"), b"partial")

    result = publish(cfg, _ctx(run), token=fake_hub.token)

    (commit,) = fake_hub.commits
    assert commit.repo_id == REPO and commit.message == "Upload model from run run-1"
    assert sorted(commit.files) == sorted([*MODEL_FILES, "README.md"])
    for name, data in MODEL_FILES.items():
        assert commit.files[name] == data
    # Weights for both frameworks went through LFS batch + PUT, like on the real Hub.
    assert commit.lfs_paths == {"tf_model.h5", "model.safetensors"}
    assert result["commit_oid"] == commit.oid
    assert result["commit_url"] == f"{fake_hub.url}/{REPO}/commit/{commit.oid}"
    assert result["files"] == sorted(commit.files)
    assert fake_hub.repos[REPO].private is True  # publish.private defaults to true

    published = storage.read_json(paths.published_metrics(str(tmp_path), REPO))
    assert published["run_id"] == "run-1" and published["loss"] == 4.5
    assert storage.read_json(run.published) == result


def test_publish_from_a_gs_output_root(gcs_root, fake_hub):
    run = make_run(gcs_root, "run-gs")
    result = publish(_cfg(gcs_root), _ctx(run), token=fake_hub.token)
    (commit,) = fake_hub.commits
    assert sorted(commit.files) == sorted([*MODEL_FILES, "README.md"]) == result["files"]
    assert commit.files["tf_model.h5"] == MODEL_FILES["tf_model.h5"]
    assert commit.files["model.safetensors"] == MODEL_FILES["model.safetensors"]
    assert storage.read_json(paths.published_metrics(gcs_root, REPO))["run_id"] == "run-gs"
    assert storage.exists(join(run.model, "README.md"))


@pytest.mark.slow
def test_a_model_saved_without_pytorch_weights_gets_them_on_publish(tmp_path, fake_hub, tiny_model):
    """Runs saved before `save` wrote model.safetensors: publish converts their tf_model.h5."""
    from safetensors.numpy import load

    from mlm_tasks.model.pt_export import expected_shapes

    _, trained = tiny_model
    run = make_run(str(tmp_path), "old-run", model=False)
    for name in ("config.json", "tf_model.h5", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        storage.write_bytes(join(run.model, name), storage.read_bytes(join(trained.model, name)))

    result = publish(_cfg(tmp_path), _ctx(run), token=fake_hub.token)

    (commit,) = fake_hub.commits
    assert "model.safetensors" in result["files"] and "model.safetensors" in commit.lfs_paths
    tensors = load(commit.files["model.safetensors"])
    config = json.loads(commit.files["config.json"])
    assert {k: v.shape for k, v in tensors.items()} == expected_shapes(config)
    assert commit.files["model.safetensors"] == storage.read_bytes(join(trained.model, "model.safetensors"))


def test_card_holds_metrics_data_credit_and_examples(tmp_path, fake_hub):
    publish(_cfg(tmp_path), _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token)
    card = fake_hub.commits[0].files["README.md"].decode()

    meta = _front_matter(card)
    assert meta["license"] == "cc-by-sa-4.0" and meta["language"] == "en"
    assert meta["pipeline_tag"] == "fill-mask" and "roberta" in meta["tags"]
    assert meta["datasets"] == ["wikimedia/wikipedia"]
    assert "Text from English Wikipedia, CC BY-SA 4.0" in card
    assert "`0123456789abcdef`" in card  # data fingerprint
    assert "| Masked-LM loss (cross-entropy) | 4.5000 |" in card
    assert "| Masked-token accuracy | 0.3000 |" in card
    assert "| Baseline accuracy (always the most frequent token, `\u2581the`) | 0.0600 |" in card
    assert "- Steps: 40" in card
    assert "`The capital of France is <mask>.` → `Paris` (0.410)" in card
    assert "## Intended use and limitations" in card
    # The card is also kept next to the model in output_root.
    assert storage.read_text(join(make_run(str(tmp_path), "run-1").model, "README.md")) == card


def test_license_is_configurable_and_public_repo_when_asked(tmp_path, fake_hub):
    cfg = _cfg(tmp_path, private=False, license="mit")
    publish(cfg, _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token)
    assert fake_hub.repos[REPO].private is False
    assert _front_matter(fake_hub.commits[0].files["README.md"].decode())["license"] == "mit"


def test_existing_public_repo_is_not_used_when_private_is_required(tmp_path, fake_hub):
    fake_hub.add_repo(REPO, private=False)
    with pytest.raises(ConfigError, match="is public: make it private"):
        publish(_cfg(tmp_path), _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token)
    assert fake_hub.commits == []


def test_rerun_after_success_is_a_no_op(tmp_path, fake_hub):
    cfg, run = _cfg(tmp_path), make_run(str(tmp_path), "run-1")
    first = publish(cfg, _ctx(run), token=fake_hub.token)
    assert publish(cfg, _ctx(run), token=fake_hub.token) == first
    assert len(fake_hub.commits) == 1


def test_bad_token_gives_clear_error_without_the_token(tmp_path, fake_hub, caplog):
    secret = "hf_wrongSecretToken123"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthError) as err:
        publish(_cfg(tmp_path), _ctx(make_run(str(tmp_path), "run-1")), token=secret)
    message = str(err.value)
    assert "rejected the token (401 Unauthorized)" in message
    assert "'huggingface_default'" in message  # which Airflow connection to fix
    assert secret not in message and secret not in caplog.text
    assert fake_hub.commits == [] and REPO not in fake_hub.repos
    assert fake_hub.requests[-1][2] == f"Bearer {secret}"  # it was really sent, and really refused


def test_missing_model_and_missing_token_say_what_to_do(tmp_path, fake_hub):
    cfg = _cfg(tmp_path)
    with pytest.raises(MissingArtifactError, match="run train"):
        publish(cfg, _ctx(make_run(str(tmp_path), "untrained", model=False)), token=fake_hub.token)
    with pytest.raises(AuthError, match="No Hugging Face token"):
        publish(cfg, _ctx(make_run(str(tmp_path), "run-1")), token="")


def test_endpoint_that_disagrees_with_hf_endpoint_is_refused(tmp_path, fake_hub):
    with pytest.raises(ConfigError, match="Set HF_ENDPOINT=http://127.0.0.1:1"):
        publish(
            _cfg(tmp_path), _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token, endpoint="http://127.0.0.1:1"
        )
    result = publish(
        _cfg(tmp_path), _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token, endpoint=fake_hub.url + "/"
    )
    assert result["commit_oid"] == fake_hub.commits[-1].oid


def test_publish_tokenizer_pushes_the_tokenizer_alone(tmp_path, fake_hub):
    data = DataPaths(str(tmp_path), "0123456789abcdef")
    files = {"tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}", "special_tokens_map.json": b"{}"}
    for name, blob in files.items():
        storage.write_bytes(join(data.tokenizer, name), blob)
    cfg = _cfg(tmp_path, tokenizer_repo_id="tester/wiki-tokenizer")

    result = publish_tokenizer(cfg, RunContext(data.output_root, fingerprint=data.fingerprint), token=fake_hub.token)

    (commit,) = fake_hub.commits_to("tester/wiki-tokenizer")
    assert sorted(commit.files) == sorted([*files, "README.md"]) == result["files"]
    assert b"0123456789abcdef" in commit.files["README.md"]
    assert not storage.exists(join(data.tokenizer, "README.md"))  # shared data dir left untouched


def _write_checkpoint(folder, step: int) -> str:
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("ckpt-"):
            os.remove(os.path.join(folder, name))
    for suffix, blob in ((".index", b"i%d" % step), (".data-00000-of-00001", b"d%d" % step)):
        with open(os.path.join(folder, f"ckpt-{step}{suffix}"), "wb") as f:
            f.write(blob)
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{step}"\n')
    return str(folder)


def test_checkpoint_syncer_uploads_in_background_and_mirrors_the_latest(tmp_path, fake_hub):
    folder = tmp_path / "checkpoints"
    sync = CheckpointSyncer(REPO, fake_hub.token)
    fake_hub.commits_released.clear()  # the Hub accepts no commit until the test says so
    sync.submit(_write_checkpoint(folder, 1), step=1)
    assert fake_hub.commit_arrived.wait(timeout=30)  # step 1 is uploading, and stuck
    sync.submit(_write_checkpoint(folder, 2), step=2)  # returns at once: waits behind step 1
    sync.submit(_write_checkpoint(folder, 3), step=3)  # replaces step 2, which never started
    assert fake_hub.commits == [] and sync.uploaded == []
    fake_hub.commits_released.set()

    uploaded = sync.close(timeout=30)

    assert [u["step"] for u in uploaded] == [1, 3] and sync.skipped_steps == [2]
    first, last = fake_hub.commits_to(REPO)
    assert first.message == "Training checkpoint at step 1"
    # The snapshot taken at submit, though the folder was overwritten while step 1 was uploading.
    assert first.files["checkpoints/ckpt-1.index"] == b"i1"
    assert first.files["checkpoints/checkpoint"] == b'model_checkpoint_path: "ckpt-1"\n'
    assert sorted(last.files) == [
        "checkpoints/checkpoint",
        "checkpoints/ckpt-3.data-00000-of-00001",
        "checkpoints/ckpt-3.index",
    ]
    assert sorted(fake_hub.repos[REPO].files) == sorted(last.files)  # step-1 files deleted in that commit
    assert uploaded[-1]["commit_oid"] == last.oid
    with pytest.raises(RuntimeError, match="after close"):
        sync.submit(str(folder), step=4)


def test_checkpoint_syncer_surfaces_upload_errors_on_close(tmp_path, fake_hub):
    secret = "hf_notTheRightOne456"
    sync = CheckpointSyncer(REPO, secret)
    sync.submit(_write_checkpoint(tmp_path / "ckpt", 1), step=1)  # does not raise: training goes on
    with pytest.raises(AuthError) as err:
        sync.close(timeout=30)
    assert "1 checkpoint upload(s)" in str(err.value) and "401" in str(err.value)
    assert secret not in str(err.value)
    assert fake_hub.commits == []


def test_importing_the_steps_loads_neither_airflow_nor_tensorflow():
    code = (
        "import sys, mlm_tasks.steps.gate, mlm_tasks.steps.publish, mlm_tasks.steps.report\n"
        "bad = [m for m in ('airflow', 'tensorflow', 'huggingface_hub', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_a_hung_hub_fails_every_hub_step_within_the_bound_saying_so(tmp_path, fake_hub):
    import time

    data = DataPaths(str(tmp_path), "0123456789abcdef")
    storage.write_bytes(join(data.tokenizer, "tokenizer.json"), b"{}")
    cfg = _cfg(tmp_path, tokenizer_repo_id="tester/wiki-tokenizer", request_timeout_s=1)
    syncer = CheckpointSyncer(REPO, fake_hub.token, timeout_s=1)
    fake_hub.stall()
    steps = {
        "publish": lambda: publish(cfg, _ctx(make_run(str(tmp_path), "run-1")), token=fake_hub.token),
        "publish_tokenizer": lambda: publish_tokenizer(
            cfg, RunContext(data.output_root, fingerprint=data.fingerprint), token=fake_hub.token
        ),
        "checkpoint sync": lambda: (
            syncer.submit(_write_checkpoint(tmp_path / "ckpt", 1), step=1),
            syncer.close(timeout=30),
        ),
    }
    for what, call in steps.items():
        started = time.monotonic()
        with pytest.raises(TransientError, match=r"did not answer within publish.request_timeout_s=1s"):
            call()
        assert time.monotonic() - started < 5, what
    assert fake_hub.commits == []
