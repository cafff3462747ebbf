"""End to end with real Airflow (`airflow dags test`, SQLite): the whole mlm_pretrain DAG on the tiny
preset in a temporary output_root, with the train task failing once on purpose and a toy downstream task.
Checks every artifact,
that try 2 resumed from the checkpoint, that the TPU VM tasks end skipped (compute local) while train
runs, and that a second run reuses the prepared data: nothing to write, so write_shards is skipped and
merge_shards still runs."""

import json
from pathlib import Path

import pytest

from peers.airflow_db import task_states
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.tiny_data import TINY_FORM

TINY = TINY_FORM


def _only_run(out: Path) -> Path:
    runs = list((out / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_pretrain_dag_end_to_end_with_a_retry(airflow_env, tmp_path):
    out = tmp_path / "out"
    task = tmp_path / "task.jsonl"  # a downstream task of the smallest size: the task runs in the DAG
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
    conf = {**TINY, "output_root": str(out), "overrides": {"downstream": downstream}}
    # The fault: a hook the trainer's environment names (no run setting can), firing once per run.
    fault = {"MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=7"}
    result = dags_test(
        airflow_env, "mlm_pretrain", conf=conf, extra_env={"MLM_RETRY_DELAY_S": "1", **fault}, timeout=900
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in log, log[-5000:]
    assert "Injected fault at step 7" in log and "new_state=up_for_retry" in log
    assert "Resumed from" in log and "at step 5" in log
    states = task_states(airflow_env, "mlm_pretrain")
    assert {
        t: states[t]
        for t in ("write_shards", "merge_shards", "check_run", "create_tpu_vm", "train", "summary", "delete_tpu_vm")
    } == {
        "write_shards": "success",
        "merge_shards": "success",
        "check_run": "success",
        "create_tpu_vm": "skipped",
        "train": "success",
        "summary": "success",
        "delete_tpu_vm": "skipped",
    }, states
    assert "this run needs no TPU VM, none is made" in log and "this run made no TPU VM, none to delete" in log

    (data,) = list((out / "datasets").iterdir())
    for rel in (
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "shards/manifest.json",
        "shards/_SUCCESS",
    ):
        assert (data / rel).is_file(), rel
    manifest = json.loads((data / "shards/manifest.json").read_text())
    for split, entry in manifest["splits"].items():
        folder = data / "shards" / split  # a split too short for one record has no folder
        assert sorted(p.name for p in (folder.iterdir() if folder.exists() else [])) == sorted(
            Path(s["file"]).name for s in entry["shards"]
        )
    assert manifest["max_length"] == 64 and manifest["splits"]["validation"]["records"] > 0

    run = _only_run(out)
    for rel in (
        "model/tf_model.h5",
        "model/config.json",
        "model/tokenizer.json",
        "checkpoints/checkpoint",
        "train/history.jsonl",
        "train/summary.json",
        "eval/metrics.json",
        "infer/predictions.json",
        "summary.txt",
    ):
        assert (run / rel).is_file(), rel
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((run / "train/summary.json").read_text())
    assert summary["steps"] == 12 and summary["resumed_from_step"] == 5
    metrics = json.loads((run / "eval/metrics.json").read_text())
    assert metrics["loss"] < metrics["untrained_loss"] and metrics["masked_tokens"] > 0
    predictions = json.loads((run / "infer/predictions.json").read_text())
    assert predictions and all(len(p["predictions"]) == 5 for p in predictions)
    assert "Evaluation validation" in (run / "summary.txt").read_text()
    scores = json.loads((run / "eval/downstream.json").read_text())
    assert [t["name"] for t in scores["tasks"]] == ["toy"] and scores["tasks"][0]["random_init"]["runs"]
    assert "| toy | accuracy |" in (run / "report/report.md").read_text()

    # A second run over the unchanged corpus reuses tokenizer and shards, and says so.
    again = dags_test(
        airflow_env,
        "mlm_pretrain",
        conf={**TINY, "output_root": str(out)},
        extra_env={"MLM_RETRY_DELAY_S": "1"},
        timeout=900,
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "Cache hit: data fingerprint" in again.stdout + again.stderr
    states = task_states(airflow_env, "mlm_pretrain")
    assert (states["write_shards"], states["merge_shards"], states["train"]) == ("skipped", "success", "success"), (
        states
    )
    assert len(list((out / "datasets").iterdir())) == 1 and len(list((out / "runs").iterdir())) == 2
