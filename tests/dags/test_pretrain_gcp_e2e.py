"""The Google Cloud path of mlm_pretrain, end to end with real Airflow (`airflow dags test`) on loopback:
output_root in the GCS emulator, the shard gate through an anonymous Airflow GCP connection, the TPU VM
in the fake TPU API, training over SSH on a real sshd (this machine's CPU), TensorFlow's gs:// through
the TLS proxy. Then the failure paths: training fails on the VM, create fails half way, the sensor times
out, the node is preempted mid-training.

    python -m pytest tests/dags/test_pretrain_gcp_e2e.py -q

Every test asserts that no node outlives its run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mlm_tasks import storage, tpu
from mlm_tasks.paths import DataPaths, RunPaths, join
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.sshd import airflow_conn_uri

ROOT = Path(__file__).resolve().parents[2]
TINY = {"config_file": str(ROOT / "configs" / "tiny.yaml"), "vocab_size": 1000, "max_length": 64, "steps": 12,
        "batch_size": 8}
PROJECT, ZONE, GCS_CONN = "mlm-test-project", "us-central2-b", "gcs_emulator"


def _conf(gcs_root: str, fake_tpu, sshd, tf_gcs_env: dict, **overrides) -> dict:
    """Tiny preset on gs:// + tpu_vm; the "VM" is this checkout behind sshd, reading the emulator the way
    a TPU VM reads GCS (tpu.env carries the emulator and TLS-proxy settings to the remote step)."""
    return {**TINY, "output_root": gcs_root, "compute": "tpu_vm", "overrides": {
        "tpu.project": PROJECT, "tpu.zone": ZONE, "tpu.api_endpoint": fake_tpu.url, "tpu.transport": "rest",
        "tpu.bootstrap": False, "tpu.workdir": str(ROOT), "tpu.python": sys.executable,
        "tpu.ssh_port": sshd.port, "tpu.poll_interval_s": 0.2,
        "tpu.env": {**tf_gcs_env, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        "sensor.gcp_conn_id": GCS_CONN, **overrides}}


def _env(sshd, tf_gcs_env: dict, gcs) -> dict:
    """The Airflow process: connections as env JSON/URI; TF's gs:// for the local evaluate step."""
    return {**tf_gcs_env, "MLM_RETRY_DELAY_S": "1",
            f"AIRFLOW_CONN_{GCS_CONN.upper()}": json.dumps(
                {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": gcs.project}}),
            "AIRFLOW_CONN_TPU_SSH": airflow_conn_uri(sshd)}


def _dags_test(airflow_env, conf: dict, env: dict, tmp_path: Path, **kwargs) -> str:
    """`airflow dags test mlm_pretrain`; returns stdout+stderr, also kept in tmp_path for debugging."""
    result = dags_test(airflow_env, "mlm_pretrain", conf=conf, extra_env=env, timeout=900, **kwargs)
    log = result.stdout + result.stderr
    (tmp_path / "airflow.log").write_text(log)
    return log if result.returncode == 0 else "DAG RUN FAILED\n" + log


def _run_id(log: str) -> str:
    found = re.search(r"run_id=(manual__[^\s,'\"]+)", log)
    assert found, log[-3000:]
    return found.group(1)


def _only_fingerprint(gcs_root: str) -> str:
    (data,) = storage.filesystem(gcs_root).ls(join(gcs_root, "datasets"), detail=False)
    return data.rstrip("/").rsplit("/", 1)[-1]


def _methods(fake_tpu) -> list[str]:
    return [m for m, _ in fake_tpu.requests]


@pytest.mark.slow
def test_gcs_and_tpu_vm_end_to_end(airflow_env, gcs, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path):  # noqa: F811
    conf = _conf(gcs_root, fake_tpu, sshd, tf_gcs_env)
    started = time.monotonic()
    log = _dags_test(airflow_env, conf, _env(sshd, tf_gcs_env, gcs), tmp_path)
    assert not log.startswith("DAG RUN FAILED") and "state=success" in log, log[-6000:]
    print(f"GCS + TPU VM run: {time.monotonic() - started:.0f}s")

    # The node: made once, through CREATING to READY, and deleted by the teardown.
    assert _methods(fake_tpu).count("POST") == 1 and _methods(fake_tpu).count("DELETE") == 1
    assert fake_tpu.nodes == {}
    # Training ran over SSH on the "VM" (worker 0's lines in the task log), on gs:// shards.
    assert "[worker 0]" in log and "Training done: 12 steps" in log

    fp = _only_fingerprint(gcs_root)
    data = DataPaths(gcs_root, fp)
    for uri in (join(data.tokenizer, "tokenizer.json"), data.manifest, data.success):
        assert storage.exists(uri), uri
    manifest = storage.read_json(data.manifest)
    for split, entry in manifest["splits"].items():
        assert entry["shards"], split
        for shard in entry["shards"]:
            assert storage.exists(join(data.shards(split), Path(shard["file"]).name)), shard

    run = RunPaths(gcs_root, _run_id(log))
    for uri in (join(run.checkpoints, "checkpoint"), join(run.model, "tf_model.h5"), join(run.model, "config.json"),
                run.train_summary, run.train_history, run.eval_metrics, run.predictions,
                join(run.report, "report.md"), join(run.root, "summary.txt")):
        assert storage.exists(uri), uri
    summary = storage.read_json(run.train_summary)
    assert summary["steps"] == 12 and summary["data_fingerprint"] == fp
    metrics = storage.read_json(run.eval_metrics)
    assert metrics["loss"] < metrics["untrained_loss"] and metrics["masked_tokens"] > 0
    predictions = storage.read_json(run.predictions)
    assert predictions and all(len(p["predictions"]) == 5 for p in predictions)
