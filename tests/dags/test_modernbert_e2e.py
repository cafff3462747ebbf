"""mlm_pretrain end to end with the form's architecture set to modernbert (real `airflow dags test`, SQLite):
train -> evaluate -> downstream -> fill-mask -> report -> gate -> publish to the fake Hub, on the tiny config.
What reaches the Hub is transformers 5's layout (config.json + model.safetensors, no tf_model.h5); the PyTorch
side of that promise is checked in tests/mlm_tasks/model/test_modernbert.py."""

import json
import secrets

import pytest

from peers.airflow_db import task_states
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.fake_hub import FakeHub
from peers.tiny_data import TINY_FORM

REPO = "tester/modernbert-tiny-mlm"


@pytest.mark.slow
def test_pretrain_dag_with_modernbert_publishes_a_transformers_5_model(airflow_env, tmp_path):
    out, task = tmp_path / "out", tmp_path / "task.jsonl"
    task.write_text(
        "".join(
            json.dumps({"sentence": f"{w} story number {i}", "label": int(w == "good")}) + "\n"
            for i in range(8)
            for w in ("good", "bad")
        )
    )
    downstream = {
        "seeds": 1,
        "steps": 2,
        "batch_size": 4,
        "max_length": 16,
        "tasks": [{"name": "toy", "train_file": str(task), "validation_file": str(task)}],
    }
    conf = {
        **TINY_FORM,
        "output_root": str(out),
        "architecture": "modernbert",
        "overrides": {"downstream": downstream, "publish.enabled": True, "publish.repo_id": REPO},
    }
    with FakeHub(token=f"hf_planted_{secrets.token_hex(16)}", user="tester") as hub:
        connection = json.dumps({"conn_type": "generic", "host": hub.url, "password": hub.token})
        env = {"AIRFLOW_CONN_HUGGINGFACE_DEFAULT": connection, "HF_ENDPOINT": hub.url, "MLM_RETRY_DELAY_S": "1"}
        result = dags_test(airflow_env, "mlm_pretrain", conf=conf, extra_env=env, timeout=900)
        log = result.stdout + result.stderr
        assert result.returncode == 0 and "state=success" in log, log[-5000:]
        (commit,) = hub.commits_to(REPO)

    states = task_states(airflow_env, "mlm_pretrain")
    for task_id in ("train", "evaluate", "downstream", "fill_mask", "report", "gate", "publish"):
        assert states[task_id] == "success", (task_id, states)
    (run,) = list((out / "runs").iterdir())
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= set(commit.files)
    assert "tf_model.h5" not in commit.files
    assert commit.files["model.safetensors"] == (run / "model" / "model.safetensors").read_bytes()
    card = commit.files["README.md"].decode()
    assert "ModernBERT-style masked language model" in card and "- modernbert" in card and "framework=" not in card

    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["loss"] < metrics["untrained_loss"] and metrics["masked_tokens"] > 0
    predictions = json.loads((run / "infer" / "predictions.json").read_text())
    assert predictions and all(len(p["predictions"]) == 5 for p in predictions)
    scores = json.loads((run / "eval" / "downstream.json").read_text())
    assert [t["name"] for t in scores["tasks"]] == ["toy"] and scores["tasks"][0]["pretrained"]["runs"]
