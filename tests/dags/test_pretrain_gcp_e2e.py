"""The Google Cloud path of mlm_pretrain, end to end with real Airflow (`airflow dags test`) on loopback:
output_root in the GCS emulator, every Google client (gcsfs, storage, the shard gate, the TPU API) through
the Airflow GCP connection google_cloud_default holding a service-account key whose tokens come from the
loopback OAuth peer, the TPU VM in the fake TPU API (which takes only those tokens), training over SSH on a real
sshd (this machine's CPU), TensorFlow's gs:// through
the TLS proxy. Then the failure paths: training fails on the VM, create fails half way, the sensor times
out, the node is preempted mid-training.

    python -m pytest tests/dags/test_pretrain_gcp_e2e.py -q

Every test asserts that no node outlives its run.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from mlm_tasks import storage
from mlm_tasks.config.deployment import DEPLOYMENT_KEYS
from mlm_tasks.paths import DataPaths, RunFolder, RunPaths, join
from peers.airflow_db import db_rows
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.fake_tpu_api import is_read
from peers.sshd import airflow_conn_uri
from peers.tiny_data import TINY_FORM
from peers.tpu_vm_image import NO_LIBTPU

ROOT = Path(__file__).resolve().parents[2]
TINY = TINY_FORM
PROJECT, ZONE = "mlm-test-project", "us-central2-b"


def _conf(gcs_root: str, fake_tpu, sshd, tf_gcs_env: dict, vm_env: dict | None = None, **overrides) -> dict:
    """Tiny preset on gs:// + tpu_vm; the "VM" is this checkout behind sshd, reading the emulator the way
    a TPU VM reads GCS (tpu.env carries the emulator and TLS-proxy settings, and `vm_env`, to the remote step)."""
    return {
        **TINY,
        "output_root": gcs_root,
        "compute": "tpu_vm",
        "overrides": {
            "tpu.project": PROJECT,
            "tpu.zone": ZONE,
            "tpu.api_endpoint": fake_tpu.url,
            "tpu.transport": "rest",
            "tpu.bootstrap": False,
            "tpu.workdir": str(ROOT),
            "tpu.python": sys.executable,
            "tpu.ssh_port": sshd.port,
            "tpu.poll_interval_s": 0.2,
            "train.follow_poll_s": 1,
            "tpu.env": {
                **tf_gcs_env,
                "HF_HUB_OFFLINE": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2",
                **NO_LIBTPU,
                **(vm_env or {}),
            },
            **overrides,
        },
    }


def _env(sshd, tf_gcs_env: dict, gcs) -> dict:
    """The Airflow process: connections as env JSON/URI (google_cloud_default, the service-account key, comes
    from the fake_tpu fixture); TF's gs:// as the VM has it."""
    # The connection as docs/google-cloud.md describes it: the login pins the host key the fake TPU API publishes.
    return {
        **tf_gcs_env,
        "MLM_RETRY_DELAY_S": "1",
        "AIRFLOW_CONN_TPU_SSH": airflow_conn_uri(sshd, no_host_key_check=False),
    }


def _deployment(conf: dict, tmp_path: Path) -> tuple[dict, Path]:
    """The conf's deployment settings (project, endpoint, the VM's python and env, ...) moved into a deployment
    file, as production has them: under Airflow a trigger may not set them, file or no file."""
    run, settings = {}, {}
    for key, value in conf["overrides"].items():
        owned = any(key == d or key.startswith(d + ".") for d in DEPLOYMENT_KEYS)
        if owned:
            section, _, leaf = key.rpartition(".")
            (settings.setdefault(section, {}) if section else settings)[leaf] = value
        else:
            run[key] = value
    path = tmp_path / "deployment.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "settings": settings,
                "output_roots": [conf["output_root"]],
                "config_dirs": [str(ROOT / "configs")],
                "input_roots": [str(ROOT)],
            }
        )
    )
    return {**conf, "overrides": run}, path


def _dags_test(airflow_env, conf: dict, env: dict, tmp_path: Path, **kwargs) -> str:
    """`airflow dags test mlm_pretrain` under a deployment file holding the conf's deployment settings; returns
    stdout+stderr, also kept in tmp_path for debugging."""
    conf, deployment = _deployment(conf, tmp_path)
    result = dags_test(
        airflow_env,
        "mlm_pretrain",
        conf=conf,
        extra_env={**env, "MLM_DEPLOYMENT": str(deployment)},
        timeout=900,
        **kwargs,
    )
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
    """Methods of the API calls, the host-key reads (getGuestAttributes, a POST) left out."""
    return [m for m, path in fake_tpu.requests if not is_read(path)]


def _check_run_artifacts(gcs_root: str, log: str, fake_tpu, sa_key, oauth_server, grants_before: int) -> RunPaths:
    """What a run on GCS + a TPU VM leaves, whatever it met on the way: every client on the connection's
    credentials, the shard set and the run's artifacts in the bucket. Returns the run's paths."""
    # Credentials: every TPU API call carried the connection's service account; gcsfs and the storage
    # clients (the emulator checks no token) refreshed that same key at the token endpoint.
    assert fake_tpu.principals == {sa_key["client_email"]}
    assert sa_key["client_email"] in oauth_server.grants[grants_before:]
    assert "Google clients use the credentials of Airflow connection 'google_cloud_default'" in log
    # Training ran over SSH on the "VM" (worker 0's lines in the task log), on gs:// shards; and the model was
    # judged there too, before delete_tpu_vm: evaluate, downstream and fill_mask logged as worker 0's lines.
    assert "[worker 0]" in log and "Training done: 12 steps" in log
    for step in ("evaluate", "downstream", "fill_mask"):
        assert f"Running {step!r} on mlm-pretrain-" in log, step
    assert re.search(r"\[worker 0\] .*Eval on validation \(\d+ masked tokens\): loss", log)
    assert re.search(r"\[worker 0\] .*downstream\.tasks is empty: no downstream evaluation", log)
    assert re.search(r"\[worker 0\] .*<mask>.* -> ", log)

    fp = _only_fingerprint(gcs_root)
    data = DataPaths(gcs_root, fp)
    # This run wrote the shards: the gate passed at once, saying why (its gs:// wait through the GCP
    # connection is tested with shards from elsewhere, test_sensor_timeout_fails_clearly_and_creates_no_node).
    assert f"Not waiting: this run wrote the shard set {data.shards_dir} itself" in log
    for uri in (join(data.tokenizer, "tokenizer.json"), data.manifest, data.success):
        assert storage.exists(uri), uri
    manifest = storage.read_json(data.manifest)
    assert manifest["splits"]["train"]["shards"] and manifest["splits"]["validation"]["shards"]
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            assert storage.exists(join(data.shards(split), Path(shard["file"]).name)), shard

    run = RunPaths(gcs_root, _run_id(log))
    for uri in (
        join(run.checkpoints, "checkpoint"),
        join(run.model, "tf_model.h5"),
        join(run.model, "config.json"),
        run.train_summary,
        run.train_history,
        run.eval_metrics,
        run.predictions,
        join(run.report, "report.md"),
        join(run.root, "summary.txt"),
    ):
        assert storage.exists(uri), uri
    summary = storage.read_json(run.train_summary)
    assert summary["steps"] == 12 and summary["data_fingerprint"] == fp
    metrics = storage.read_json(run.eval_metrics)
    assert metrics["loss"] < metrics["untrained_loss"] and metrics["masked_tokens"] > 0
    predictions = storage.read_json(run.predictions)
    assert predictions and all(len(p["predictions"]) == 5 for p in predictions)
    return run


@pytest.mark.slow
def test_training_failure_on_the_vm_fails_the_task_and_deletes_the_node(
    airflow_env, gcs, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path, tiny_prepared
):
    # The "VM" has no TPU runtime: train.device=tpu makes train() fail on it in TPUStrategy setup,
    # after loading the shards' manifest and tokenizer from gs://; every try fails the same way. The bucket
    # holds the shard set already (plan_shards finds it complete): this test is about the failure, not the data.
    storage.upload_dir(join(tiny_prepared[0].output_root, "datasets"), join(gcs_root, "datasets"))
    conf = _conf(gcs_root, fake_tpu, sshd, tf_gcs_env, **{"train.device": "tpu"})
    log = _dags_test(airflow_env, conf, _env(sshd, tf_gcs_env, gcs), tmp_path)
    assert log.startswith("DAG RUN FAILED"), log[-6000:]
    # Each try started its own detached trainer (the last one had ended), which exited 1; the task's error
    # names it and carries the last lines of its log on the VM: 3 tries (retries exhausted).
    failed = re.findall(
        r"AirflowException: Training failed on TPU VM \S+: the trainer \(pid \d+, try (\d)\) on \S+ "
        r"exited with code 1\.",
        log,
    )
    assert sorted(set(failed)) == ["1", "2", "3"], log[-6000:]
    assert log.count("tensorflow.python.framework.errors_impl.NotFoundError: TPUs not found") >= 3
    assert re.search(r"Task failed: mlm_pretrain\.train run \S+ try 3 of 3", log)
    # The teardown deleted the node although train failed; nothing after train ran.
    assert _methods(fake_tpu).count("POST") == 1 and _methods(fake_tpu).count("DELETE") == 1
    assert fake_tpu.nodes == {}
    run = RunPaths(gcs_root, _run_id(log))
    assert not storage.exists(run.eval_metrics) and not storage.exists(run.train_summary)


def _preempt_at_fault(fake_tpu, gcs_root: str, stop: threading.Event, seen: list) -> None:
    """When the train step dies on the VM (the injected fault), mark the node PREEMPTED, as GCP would."""
    fs = storage.filesystem(gcs_root)
    while not stop.is_set():
        if fs.glob(RunFolder(gcs_root, "*").fault_marker):  # any run's: the run id is Airflow's to choose
            (name,) = list(fake_tpu.nodes)
            fake_tpu.preempt(name.rsplit("/", 1)[-1])
            seen.append(name)
            return
        time.sleep(0.1)


@pytest.mark.slow
def test_gcs_and_tpu_vm_end_to_end_through_a_stockout_and_a_preemption(
    airflow_env, gcs, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path, oauth_server, sa_key
):
    """The whole Google Cloud path in one run (a tiny run costs ~2 CPU-minutes on CI's two cores; a clean run
    and a recovering one were two tests once): every artifact in the bucket, every client on the connection's
    credentials, and on the way a create that stocks out and a node preempted mid-training, both recovered on
    fresh nodes inside their tries, every node deleted."""
    # create_tpu_vm's first create: the node appears, then its create operation fails (a stockout), which
    # the task waits out in the same try.
    fake_tpu.fail_next_create("There is no more capacity in the zone")
    # The fault: a hook the trainer's environment on the VM names (tpu.env, the deployment's: no run can set it).
    fault = {"MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=7"}
    conf = _conf(gcs_root, fake_tpu, sshd, tf_gcs_env, fault)
    grants_before = len(oauth_server.grants)
    stop, preempted = threading.Event(), []
    watcher = threading.Thread(target=_preempt_at_fault, args=(fake_tpu, gcs_root, stop, preempted), daemon=True)
    watcher.start()
    try:
        log = _dags_test(airflow_env, conf, _env(sshd, tf_gcs_env, gcs), tmp_path)
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert not log.startswith("DAG RUN FAILED") and "state=success" in log, log[-6000:]
    assert preempted, "the train step never reached the injected fault"

    methods = _methods(fake_tpu)
    # create (no capacity) -> its delete -> create again, in the same try -> replace the preempted node:
    # delete, create -> teardown delete.
    writes = [m for m in methods if m in ("POST", "DELETE")]
    assert writes == ["POST", "DELETE", "POST", "DELETE", "POST", "DELETE"], writes
    assert fake_tpu.nodes == {}
    # The API's 429 and 503 before the first create went through were retried.
    assert [c for m, path, c in fake_tpu.answers if m == "POST" and not is_read(path)][:3] == [429, 503, 200]
    assert "No capacity for v4-8 in us-central2-b (" in log and "There is no more capacity in the zone" in log
    tries = db_rows(
        airflow_env,
        "SELECT task_id, try_number FROM task_instance WHERE run_id = ? AND task_id IN ('create_tpu_vm', 'train')",
        _run_id(log),
    )
    # Neither the stockout nor the fault cost a try: a trainer that failed as its node went PREEMPTED is a
    # restart inside the try (issue 48: the node's word first).
    assert dict(tries) == {"create_tpu_vm": 1, "train": 1}, tries
    assert "Injected fault at step 7" in log and "PREEMPTED" in log
    # The preempted node was not waited on for host keys it never publishes: its state answered at once (read by
    # the follow before any SSH, or by the SSH login's key lookup: which comes first is the race's).
    assert "has not published worker 0's SSH host keys yet" not in log

    run = _check_run_artifacts(gcs_root, log, fake_tpu, sa_key, oauth_server, grants_before)
    # The trainer is a detached job whose log stays on the VM: its resume shows in the run's records.
    summary = storage.read_json(run.train_summary)
    assert summary["steps"] == 12 and summary["resumed_from_step"] == 5
    status = storage.read_json(run.train_status)  # the faulted trainer, then one on the fresh node
    assert (status["state"], status["step"], status["starts"]) == ("done", 12, 2)
    assert storage.exists(run.eval_metrics) and storage.exists(run.predictions)


SENSOR_DAG = '''
"""Test DAG: the gate of mlm_pretrain in front of its TPU tasks, waiting for a marker that never lands."""
import pendulum
from airflow.sdk import dag, task

from mlm_airflow.sensors.shard_set import ShardSetCompleteSensor
from mlm_airflow.operators.tpu_vm import TpuVmCreateOperator, TpuVmDeleteOperator
from mlm_airflow.operators.train import TrainOperator


@dag(dag_id="gate_before_tpu", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
def gate_before_tpu():
    @task
    def validate(**context):
        from mlm_tasks.config import build_config
        return build_config(context["dag_run"].conf["config"]).model_dump(mode="json")

    @task
    def merge_shards(**context):  # shards from elsewhere: this run did not write them
        return {"fingerprint": "0123456789abcdef", "success_uri": context["dag_run"].conf["marker"],
                "cache_hit": True, "written_here": False}

    cfg = validated = validate()
    data = merge_shards()
    # As in mlm_pretrain, but not deferrable: `dags test` runs triggers inline and never times them out.
    # Poke interval and timeout come from the run's config (sensor.*).
    wait = ShardSetCompleteSensor(task_id="wait_for_shards", config=validated, data=data, deferrable=False,
                                  retries=0)
    create = TpuVmCreateOperator(task_id="create_tpu_vm", config=cfg)
    train = TrainOperator(task_id="train", config=cfg, data=data)
    delete = TpuVmDeleteOperator(task_id="delete_tpu_vm", config=cfg)
    validated >> data >> wait >> create >> train
    train >> delete.as_teardown(setups=create)


gate_before_tpu()
'''


def test_sensor_timeout_fails_clearly_and_creates_no_node(
    airflow_env, gcs, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path
):
    dag_file = tmp_path / "gate_before_tpu.py"
    dag_file.write_text(SENSOR_DAG)
    config = {
        "output_root": gcs_root,
        "compute": "tpu_vm",
        "sensor": {"poke_interval_s": 1, "timeout_s": 4},
        "tpu": {"project": PROJECT, "zone": ZONE, "api_endpoint": fake_tpu.url, "transport": "rest"},
    }
    marker = DataPaths(gcs_root, "0123456789abcdef").success
    result = dags_test(
        airflow_env,
        "gate_before_tpu",
        dagfile=dag_file,
        conf={"config": config, "marker": marker},
        extra_env=_env(sshd, tf_gcs_env, gcs),
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0, log[-6000:]
    shards = marker.rsplit("/", 1)[0]
    assert f"Shards under {shards} not complete after 4 s: no {marker}" in log, log[-6000:]
    assert "This run did not write that set" in log and "raise sensor.timeout_s" in log
    assert fake_tpu.requests == [], "no TPU API call may happen before the shard set is complete"
