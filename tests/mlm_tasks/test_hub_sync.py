"""Checkpoint sync during training (publish.sync_checkpoints) against the fake Hub: the real train step,
the real huggingface_hub client, uploads at epoch ends that never hold training up."""
import json
import threading
import time
from pathlib import Path

import pytest

from mlm_tasks.config import ConfigError
from mlm_tasks.paths import RunPaths
from peers.tiny_data import tiny_config

REPO = "tester/ckpt-sync"
TRAIN_RECORDS = 100


def _small_corpus(path: Path, chars: int = 80_000) -> None:
    from mlm_tasks.corpus import open_corpus

    rows, size = [], 0
    for article in open_corpus(tiny_config("unused").corpus).articles():
        for row in article.rows:
            rows.append(row)
            size += len(row)
        if size >= chars:
            break
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_sync_off_by_default_and_fails_fast_without_token_or_repo(tmp_path, monkeypatch):
    from mlm_tasks.hub_sync import EpochSync

    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert EpochSync.start(tiny_config(tmp_path), TRAIN_RECORDS, 8) is None
    with pytest.raises(ConfigError, match="HF_TOKEN is not set"):
        EpochSync.start(tiny_config(tmp_path, **{"publish.sync_checkpoints": True, "publish.repo_id": REPO}),
                        TRAIN_RECORDS, 8)
    with pytest.raises(ConfigError, match="needs publish.repo_id"):
        EpochSync.start(tiny_config(tmp_path, **{"publish.sync_checkpoints": True}), TRAIN_RECORDS, 8)


@pytest.mark.slow
def test_checkpoints_reach_the_hub_at_epoch_ends_without_blocking_training(tmp_path, fake_hub, monkeypatch):
    from mlm_tasks.prepare import prepare_data
    from mlm_tasks.train import train

    corpus = tmp_path / "corpus.txt"
    _small_corpus(corpus)
    settings = {"corpus.source": "local_files", "corpus.local_paths": [str(corpus)],
                "publish.sync_checkpoints": True, "publish.repo_id": REPO, "train.log_every": 1}
    data = prepare_data(tiny_config(tmp_path / "out", **settings))
    epoch = data["records"]["train"] // 8  # steps per epoch at the tiny preset's batch of 8
    steps = 2 * epoch + 3
    cfg = tiny_config(tmp_path / "out", **settings, **{"train.steps": steps})
    run = RunPaths(cfg.output_root, "sync-run")
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)

    # Hold every commit on the Hub: training must go on regardless.
    fake_hub.commits_released.clear()
    outcome = {}

    def work():
        try:
            outcome["summary"] = train(cfg, "sync-run", data["fingerprint"])
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = err

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert fake_hub.commit_arrived.wait(300), outcome
    final_index = Path(run.checkpoints) / f"ckpt-{steps}.index"
    deadline = time.time() + 300
    while not final_index.exists() and time.time() < deadline and worker.is_alive():
        time.sleep(0.2)
    # The epoch-1 upload is still held at its commit, yet training has saved its last checkpoint.
    assert final_index.exists() and not fake_hub.commits_to(REPO), outcome
    fake_hub.commits_released.set()
    worker.join(600)
    assert "summary" in outcome, outcome
    assert outcome["summary"]["steps"] == steps

    # Epoch 1 was uploaded; epoch 2's checkpoint was still waiting when the final one came, so only the
    # newest waiting one was kept (uploads never queue up behind a slow Hub).
    commits = fake_hub.commits_to(REPO)
    assert [c.message for c in commits] == [f"Training checkpoint at step {epoch}",
                                            f"Training checkpoint at step {steps}"]
    assert fake_hub.repos[REPO].private
    first = {p for p in commits[0].files}
    assert first == {"checkpoints/checkpoint", f"checkpoints/ckpt-{epoch}.index",
                     f"checkpoints/ckpt-{epoch}.data-00000-of-00001"}
    files = fake_hub.repos[REPO].files  # the repo mirrors exactly the final checkpoint
    assert set(files) == {"checkpoints/checkpoint", f"checkpoints/ckpt-{steps}.index",
                          f"checkpoints/ckpt-{steps}.data-00000-of-00001"}
    for name in (f"ckpt-{steps}.index", f"ckpt-{steps}.data-00000-of-00001"):
        assert files[f"checkpoints/{name}"] == (Path(run.checkpoints) / name).read_bytes()

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
