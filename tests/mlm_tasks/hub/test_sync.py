"""Checkpoint sync during training (publish.sync_checkpoints, mlm_tasks/hub/sync.py) against the fake Hub:
the real train step, the real huggingface_hub client, uploads at epoch ends that never hold training up.

    python -m pytest tests/mlm_tasks/hub/test_sync.py -q
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest

from mlm_tasks.errors import AuthError, ConfigError
from mlm_tasks.paths import RunContext, RunPaths
from peers.tiny_data import tiny_config

REPO = "tester/ckpt-sync"
TRAIN_RECORDS = 100


def _small_corpus(path: Path, chars: int = 80_000) -> None:
    from mlm_tasks.data.corpus import open_corpus

    rows, size = [], 0
    for article in open_corpus(tiny_config("unused").corpus).articles():
        for row in article.rows:
            rows.append(row)
            size += len(row)
        if size >= chars:
            break
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_sync_off_by_default_and_fails_fast_without_token_or_repo(tmp_path):
    from mlm_tasks.hub.sync import check_sync_settings, hub_checkpoint_sync

    sizes = {"train_records": TRAIN_RECORDS, "global_batch": 8, "total_steps": 30}
    assert hub_checkpoint_sync(tiny_config(tmp_path), None, **sizes) is None
    check_sync_settings(tiny_config(tmp_path), None)  # off: nothing to check
    on = tiny_config(tmp_path, **{"publish.sync_checkpoints": True, "publish.repo_id": REPO})
    for call in (lambda: check_sync_settings(on, None), lambda: hub_checkpoint_sync(on, "", **sizes)):
        with pytest.raises(AuthError, match="no Hub token"):
            call()
    with pytest.raises(ConfigError, match="needs publish.repo_id"):
        check_sync_settings(tiny_config(tmp_path, **{"publish.sync_checkpoints": True}), "hf_token")


def test_train_with_sync_and_no_token_says_what_to_do_and_ignores_the_environment(tmp_path, monkeypatch):
    """The token is train()'s argument: HF_TOKEN in the environment is the CLI's business, not the step's.
    The check comes before any data is read (there is none under this output_root)."""
    from mlm_tasks.steps.train import train

    monkeypatch.setenv("HF_TOKEN", "hf_in_the_environment")
    cfg = tiny_config(tmp_path / "out", **{"publish.sync_checkpoints": True, "publish.repo_id": REPO})
    with pytest.raises(AuthError) as err:
        train(cfg, RunContext.of(cfg, "no-token", "0123456789abcdef"))
    msg = str(err.value)
    assert "publish.sync_checkpoints is on but train() got no Hub token (hub_token)" in msg
    assert "HF_TOKEN" in msg and "'huggingface_default'" in msg and "turn publish.sync_checkpoints off" in msg


def test_cli_hands_hf_token_to_train_explicitly(tmp_path, monkeypatch):
    """The CLI boundary reads HF_TOKEN once and passes it (a TPU VM's line hands it on stdin instead:
    test_the_cli_reads_the_token_from_stdin)."""
    import mlm_tasks.steps.train
    from mlm_tasks.cli import run_step

    seen = {}
    monkeypatch.setattr(mlm_tasks.steps.train, "train", lambda cfg, ctx, **kw: seen.update(kw) or {"steps": 1})
    monkeypatch.setenv("HF_TOKEN", "hf_from_cli_env")
    cfg = tiny_config(tmp_path)
    assert run_step("train", cfg, RunContext.of(cfg, "r", "fp")) == {"steps": 1}
    assert seen == {"hub_token": "hf_from_cli_env"}
    monkeypatch.delenv("HF_TOKEN")
    run_step("train", cfg, RunContext.of(cfg, "r", "fp"))
    assert seen == {"hub_token": None}


def test_the_cli_reads_the_token_from_stdin(tmp_path, monkeypatch):
    """--hub-token-stdin: the first line of stdin, ahead of HF_TOKEN, read before the step runs."""
    import io

    import mlm_tasks.cli
    import mlm_tasks.steps.train

    seen = {}
    monkeypatch.setattr(mlm_tasks.steps.train, "train", lambda cfg, ctx, **kw: seen.update(kw) or {"steps": 1})
    monkeypatch.setattr(mlm_tasks.cli, "_stdin_token", None)
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    monkeypatch.setattr("sys.stdin", io.StringIO("hf_from_stdin\n"))
    cfg = tiny_config(tmp_path)
    code = mlm_tasks.cli.main(
        [
            "train",
            "--config-json",
            cfg.model_dump_json(),
            "--run-id",
            "r",
            "--data-fingerprint",
            "0123456789abcdef",
            "--hub-token-stdin",
        ]
    )
    assert code == 0 and seen == {"hub_token": "hf_from_stdin"}


@pytest.mark.slow
def test_checkpoints_reach_the_hub_at_epoch_ends_without_blocking_training(tmp_path, fake_hub, monkeypatch):
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.train import train

    corpus = tmp_path / "corpus.txt"
    _small_corpus(corpus)
    settings = {
        "corpus.source": "local_files",
        "corpus.local_paths": [str(corpus)],
        "publish.sync_checkpoints": True,
        "publish.repo_id": REPO,
        "train.log_every": 1,
    }
    data = build_shard_set(tiny_config(tmp_path / "out", **settings))
    epoch = data["records"]["train"] // 8  # steps per epoch at the tiny preset's batch of 8
    steps = 2 * epoch + 3
    cfg = tiny_config(tmp_path / "out", **settings, **{"train.steps": steps})
    run = RunPaths(cfg.output_root, "sync-run")
    assert "HF_TOKEN" not in os.environ  # the fake_hub fixture removes it: the token is an argument only
    saved = []  # the generic hook sees every checkpoint train saves: its own cadence, epoch ends, the final one

    # Hold every commit on the Hub: training must go on regardless.
    fake_hub.commits_released.clear()
    outcome = {}

    def work():
        try:
            outcome["summary"] = train(
                cfg,
                RunContext.of(cfg, "sync-run", data["fingerprint"]),
                hub_token=fake_hub.token,
                on_checkpoint=lambda step, path: saved.append((step, path)),
            )
        except BaseException as err:  # reported by the assertion below
            outcome["error"] = err

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert fake_hub.commit_arrived.wait(300), outcome
    final_index = Path(run.checkpoints) / f"ckpt-{steps}.index"
    deadline = time.time() + 300
    # The final checkpoint's hook ran (after the sync's, which queued it): not merely its file written.
    while steps not in [step for step, _ in saved] and time.time() < deadline and worker.is_alive():
        time.sleep(0.2)
    # The epoch-1 upload is still held at its commit, yet training has saved its last checkpoint.
    assert final_index.exists() and not fake_hub.commits_to(REPO), outcome
    fake_hub.commits_released.set()
    worker.join(600)
    assert "summary" in outcome, outcome
    assert outcome["summary"]["steps"] == steps
    every = cfg.train.checkpoint_every
    assert [step for step, _ in saved] == sorted({*range(every, steps, every), epoch, 2 * epoch, steps})
    assert all(path == f"{run.checkpoints}/ckpt-{step}" for step, path in saved), saved

    # Epoch 1 was uploaded; epoch 2's checkpoint was still waiting when the final one came, so only the
    # newest waiting one was kept (uploads never queue up behind a slow Hub).
    commits = fake_hub.commits_to(REPO)
    assert [(c.revision, c.message) for c in commits] == [
        ("main", f"Training checkpoint at step {epoch}"),
        (f"step-{epoch}", f"Model at step {epoch}"),
        ("main", f"Training checkpoint at step {steps}"),
        (f"step-{steps}", f"Model at step {steps}"),
    ]
    commits = [c for c in commits if c.revision == "main"]
    assert fake_hub.repos[REPO].private
    first = {p for p in commits[0].files}
    assert first == {
        "checkpoints/checkpoint",
        f"checkpoints/ckpt-{epoch}.index",
        f"checkpoints/ckpt-{epoch}.data-00000-of-00001",
    }
    files = fake_hub.repos[REPO].files  # the repo mirrors exactly the final checkpoint
    assert set(files) == {
        "checkpoints/checkpoint",
        f"checkpoints/ckpt-{steps}.index",
        f"checkpoints/ckpt-{steps}.data-00000-of-00001",
    }
    for name in (f"ckpt-{steps}.index", f"ckpt-{steps}.data-00000-of-00001"):
        assert files[f"checkpoints/{name}"] == (Path(run.checkpoints) / name).read_bytes()
    # Each synced step is also a loadable model (test_a_synced_step_loads_from_its_revision_...): the
    # last step's revision holds the run's model folder as train saved it, beside that step's checkpoint.
    repo = fake_hub.repos[REPO]
    assert set(repo.branches) == {"main", f"step-{epoch}", f"step-{steps}"}
    last = repo.history[repo.branches[f"step-{steps}"]]
    assert {p: last[p] for p in files} == files
    model = {p.name: p.read_bytes() for p in Path(run.model).iterdir()}
    assert {p: b for p, b in last.items() if p not in files} == model
    assert repo.history[repo.branches[f"step-{epoch}"]]["model.safetensors"] != last["model.safetensors"]

    # What was uploaded is a checkpoint TensorFlow can find and read back.
    import tensorflow as tf

    download = tmp_path / "from_hub"
    download.mkdir()
    for path, blob in files.items():
        (download / Path(path).name).write_bytes(blob)
    latest = tf.train.latest_checkpoint(str(download))
    assert latest == str(download / f"ckpt-{steps}")
    assert int(tf.train.load_variable(latest, "step/.ATTRIBUTES/VARIABLE_VALUE")) == steps
    assert fake_hub.token not in json.dumps(outcome["summary"])


PT_LOAD = """
import json, sys, torch, transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer
repo, revision, text = sys.argv[1:4]
model, info = AutoModelForMaskedLM.from_pretrained(repo, revision=revision, output_loading_info=True)
tok = AutoTokenizer.from_pretrained(repo, revision=revision)
with torch.no_grad():
    logits = model(**tok(text, return_tensors="pt")).logits[0]
loading = {k: sorted(map(str, v)) for k, v in info.items()}
print(json.dumps({"transformers": transformers.__version__, "info": loading, "logits": logits.tolist()}))
"""


def test_a_synced_step_loads_from_its_revision_in_tensorflow_and_in_transformers_5(tiny_model, pt_python, fake_hub):
    """The syncer's model folder of a step becomes the branch `step-N`, which transformers 4.57 (TensorFlow,
    here) and 5.x (PyTorch, .venv-pt, with its own huggingface_hub) load by `from_pretrained(revision=)`."""
    import subprocess
    import tempfile

    import numpy as np
    from transformers import AutoTokenizer, TFAutoModelForMaskedLM

    from mlm_tasks.hub.sync import CheckpointSyncer, stage_checkpoint
    from peers.model_clients import TRAIN_STEPS, client_env

    _, run = tiny_model
    text = "The state is <mask>."
    model_dir = tempfile.mkdtemp()  # the syncer's to delete, as the train hook hands it over
    for name in os.listdir(run.model):
        Path(model_dir, name).write_bytes(Path(run.model, name).read_bytes())
    staged = stage_checkpoint(f"{run.checkpoints}/ckpt-{TRAIN_STEPS}")
    syncer = CheckpointSyncer(REPO, fake_hub.token, fake_hub.url)
    syncer.submit(staged, TRAIN_STEPS, model_dir)
    syncer.close()
    branch = f"step-{TRAIN_STEPS}"
    (done,) = syncer.uploaded
    repo = fake_hub.repos[REPO]
    assert done["revision"] == branch and repo.branches[branch] == done["revision_oid"] != repo.sha
    assert not os.path.exists(model_dir)
    # main holds the checkpoint alone; the branch, made from that commit, the checkpoint and the model.
    at_branch = repo.history[repo.branches[branch]]
    assert set(repo.files) < set(at_branch) and set(at_branch) - set(repo.files) == set(os.listdir(run.model))
    assert at_branch["model.safetensors"] == Path(run.model, "model.safetensors").read_bytes()

    def tf_logits(where, **kw):
        model = TFAutoModelForMaskedLM.from_pretrained(where, use_safetensors=False, **kw)
        return model(**AutoTokenizer.from_pretrained(where, **kw)(text, return_tensors="tf")).logits[0].numpy()

    from_hub = tf_logits(REPO, revision=branch, token=fake_hub.token)
    np.testing.assert_array_equal(from_hub, tf_logits(str(run.model)))
    with pytest.raises(OSError, match="step-999"):  # a step never synced is no revision
        TFAutoModelForMaskedLM.from_pretrained(REPO, revision="step-999", token=fake_hub.token)

    env = {k: v for k, v in client_env().items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=fake_hub.url, HF_TOKEN=fake_hub.token, HF_HOME=tempfile.mkdtemp())
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [pt_python, "-c", PT_LOAD, REPO, branch, text], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    pt = json.loads(done.stdout.strip().splitlines()[-1])
    assert pt["transformers"].startswith("5.") and not any(pt["info"].values()), pt["info"]
    np.testing.assert_allclose(np.array(pt["logits"]), from_hub, atol=1e-4)
