"""The real TPU VM bootstrap on a simulated TPU VM image, end to end.

    python -m pytest tests/plugins/test_simulated_tpu_vm.py -q

The "worker" is a real sshd on loopback whose step runs in a fresh Python 3.10 environment holding
exactly what each supported runtime's image preinstalled as released (tests/peers/tpu_vm_image.py:
TensorFlow 2.16.1 or 2.17.0 under its own wheel name, and its own dependencies as of the runtime's
date). The bucket is the GCS emulator
(TensorFlow's gs:// reaches it through the TLS proxy). The train task stages the installed package
to the bucket, the VM fetches it with its own TensorFlow, installs the VM lock with pip from the
package index, checks the image, and trains the tiny preset from gs:// shards. On the default image the model
is then judged where it trained, as the DAG's tasks do with compute tpu_vm: evaluate, downstream (the held-out article
task, which reads the corpus with gensim's parser in the image's Python) and fill_mask on the same VM.
The Airflow side (Python 3.11, TensorFlow 2.21) reads the checkpoint and loads the model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlm_tasks import storage
from mlm_tasks.config import DownstreamTask, PipelineConfig
from mlm_tasks.job.restarts import read_restarts
from mlm_tasks.paths import RunPaths, join
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import runtimes
from peers import tpu_vm_image
from peers.deferral import run_deferrable
from peers.sshd import airflow_conn_uri

ZONE = "us-central2-b"
RUN = "manual__sim-vm"


def _pip_past_the_gcs_proxy(tf_gcs_env: dict) -> dict:
    """The TLS proxy that stands in for Google's hosts refuses the rest; pip on a real VM reaches the
    package index directly, so it does here too."""
    hosts = tf_gcs_env["NO_PROXY"] + ",pypi.org,files.pythonhosted.org"
    # The image's pip of 2024 (requests, no truststore) takes CURL_CA_BUNDLE, which names the proxy's CA
    # for TensorFlow's curl: REQUESTS_CA_BUNDLE, read first, gives it this machine's CAs for the index.
    cas = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    return {"NO_PROXY": hosts, "no_proxy": hosts, "REQUESTS_CA_BUNDLE": cas}


def _site_packages(python: str) -> set[str]:
    (site,) = Path(python).parent.parent.glob("lib/python3.10/site-packages")
    # __pycache__ appears on the first import of a top-level module: bytecode, not a package change.
    return {p.name for p in site.iterdir() if p.name != "__pycache__"}


def _vm_config(prepared_cfg, root, runtime, python, workdir, fake_tpu, sshd, tf_gcs_env, **train):
    return PipelineConfig.model_validate(
        {
            **prepared_cfg.model_dump(mode="json"),
            "output_root": root,
            "compute": "tpu_vm",
            "train": {**prepared_cfg.train.model_dump(mode="json"), "follow_poll_s": 0.5, **train},
            "tpu": {
                "project": "proj",
                "zone": ZONE,
                "runtime_version": runtime,
                "api_endpoint": fake_tpu.url,
                "transport": "rest",
                "ssh_port": sshd.port,
                "poll_interval_s": 0.1,
                "bootstrap": True,
                "python": python,
                "workdir": str(workdir),
                "env": {
                    **tf_gcs_env,
                    **_pip_past_the_gcs_proxy(tf_gcs_env),
                    "HF_HUB_OFFLINE": "1",
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                    **tpu_vm_image.NO_LIBTPU,
                },
            },
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.17.0-pjrt"])
def test_bootstrap_train_and_judge_on_the_simulated_image(
    runtime, tiny_prepared, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path, monkeypatch, capfd, caplog
):
    from mlm_airflow.operators.remote_step import step_on_vm
    from mlm_airflow.operators.train import TrainOperator

    rt = runtimes.get(runtime)
    tpu_vm_python = str(tpu_vm_image.build(rt))  # the image as released: its date's packages

    prepared_cfg, data = tiny_prepared
    root = gcs_root
    storage.upload_dir(join(prepared_cfg.output_root, "datasets"), join(root, "datasets"))
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd, no_host_key_check=False))
    for key, value in tf_gcs_env.items():  # evaluate and fill-mask read gs:// here with TensorFlow too
        monkeypatch.setenv(key, value)
    cfg = _vm_config(
        prepared_cfg, root, runtime, tpu_vm_python, tmp_path / "vm home" / "mlm", fake_tpu, sshd, tf_gcs_env
    )
    name = tpu.node_name("mlm_pretrain", RUN)
    fake_tpu.add_node("proj", ZONE, name, state="READY")
    image_before = _site_packages(tpu_vm_python)
    context = {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": RUN}

    train = TrainOperator(task_id="train", config=cfg.model_dump(mode="json"), data=data)
    assert run_deferrable(train, lambda: context, timeout=900) == {"node": name, "workers": 1}
    log = capfd.readouterr().out
    (tmp_path / "train_task.log").write_text(log)  # kept for debugging
    assert "Installing project" in log and f"Installing {rt.lock_path.name} beside the image TensorFlow" in log
    assert (
        f"[worker 0] VM ready: Python 3.10.13, TensorFlow {rt.tensorflow}, tf-keras {rt.tf_minor}.0, "
        "transformers 4.57.6, datasets 5.0.1"
    ) in log

    run = RunPaths(root, RUN)
    assert storage.exists(join(root, "_code"))  # staged to the bucket, fetched from there
    summary = storage.read_json(run.train_summary)
    assert (summary["python"], summary["tensorflow"]) == ("3.10.13", rt.tensorflow)  # on the image's stack
    assert summary["steps"] == cfg.train.steps and summary["replicas"] == 1
    assert summary["global_batch"] == cfg.train.batch_size * summary["replicas"]
    assert _site_packages(tpu_vm_python) == image_before, "the bootstrap changed the image's own packages"

    # The Airflow side (TensorFlow 2.21) reads what the image's TensorFlow wrote: the checkpoint and the model.
    # In a subprocess, as TensorFlow must be for its gs:// to reach the emulator through the TLS proxy (which
    # runs in this process).
    env = {**os.environ, **tf_gcs_env, "HF_HUB_OFFLINE": "1"}
    airflow_side = f"""
import tempfile, tensorflow as tf
from transformers import TFRobertaForMaskedLM
from mlm_tasks import storage
assert tf.__version__.startswith("2.21"), tf.__version__
names = [n for n, _ in tf.train.list_variables(tf.train.latest_checkpoint({run.checkpoints!r}))]
assert any(n.endswith("roberta/embeddings/weight/.ATTRIBUTES/VARIABLE_VALUE") for n in names), names
with tempfile.TemporaryDirectory() as tmp:
    TFRobertaForMaskedLM.from_pretrained(storage.download_dir({run.model!r}, tmp), use_safetensors=False)
"""
    subprocess.run([sys.executable, "-c", airflow_side], env=env, check=True, timeout=300)

    if runtime != runtimes.DEFAULT:
        return  # judging and the retry are the same code on any image: checked once, on the default image
    # Judged where it trained: the three steps on the VM, their results the tasks' XCom.
    judged = cfg.model_copy(
        update={
            # 40% of the 12 articles held out: enough for the task's classes (it reads the corpus, not the shards).
            "corpus": cfg.corpus.model_copy(update={"test_fraction": 0.4}),
            "downstream": cfg.downstream.model_copy(
                update={
                    "tasks": [DownstreamTask(name="which_article", source="held_out_article")],
                    "seeds": 1,
                    "steps": 3,
                    "random_init": False,
                }
            ),
        }
    )
    with caplog.at_level("INFO"):
        metrics = step_on_vm(context, judged, "evaluate", ["--data-fingerprint", data["fingerprint"]])
        table = step_on_vm(context, judged, "downstream")
        predictions = step_on_vm(context, judged, "fill_mask")
    assert metrics == storage.read_json(run.eval_metrics) and 0 < metrics["loss"] < metrics["untrained_loss"]
    # The held-out task read the corpus's articles on the VM, with gensim's parser.
    assert [t["name"] for t in table["tasks"]] == ["which_article"] and table == storage.read_json(run.downstream)
    assert predictions == storage.read_json(run.predictions) and all(p["predictions"] for p in predictions)
    vm_lines = [line for line in caplog.text.splitlines() if "[worker 0]" in line]
    assert any("Eval on validation" in line for line in vm_lines), caplog.text[-3000:]
    assert any("Downstream scores of 1 task(s)" in line for line in vm_lines)

    # A retry finds the install and the finished training: nothing is installed or trained again.
    run_deferrable(TrainOperator(task_id="train", config=cfg.model_dump(mode="json"), data=data), lambda: context)
    again = capfd.readouterr().out
    (tmp_path / "retry_task.log").write_text(again)
    # The launch prints what it installs ([worker 0] lines); the trainer's log (its last lines) says why it did nothing.
    assert "[worker 0] Installing" not in again and "already finished training" in again


@pytest.mark.slow
def test_a_sigkilled_train_task_leaves_the_real_trainer_running_and_the_retry_reattaches(
    tiny_prepared, gcs_root, tf_gcs_env, fake_tpu, sshd, tmp_path, monkeypatch, capfd
):
    """The real trainer (TensorFlow 2.16 on the simulated image) outlives the SIGKILLed process of the
    train task; the retry reattaches. Then the VM's preemption notice (SIGTERM to the trainer, as a Spot
    preemption or a maintenance shutdown sends) at step 70, between periodic checkpoints (every 50): the
    trainer saves a checkpoint at that step and exits 75, and the task starts a new trainer from it in the
    same try. Every step once, none lost (that a resumed run's losses match an undisturbed one's is
    tests/mlm_tasks/steps/test_train.py's)."""
    import json
    import signal
    import threading
    import time

    from mlm_airflow.operators.train import TrainOperator
    from peers.task_state import FileTaskState, start_train_task

    runtime = runtimes.get(runtimes.DEFAULT)
    python = str(tpu_vm_image.build(runtime))
    prepared_cfg, data = tiny_prepared
    storage.upload_dir(join(prepared_cfg.output_root, "datasets"), join(gcs_root, "datasets"))
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd, no_host_key_check=False))
    steps = 120  # the retry reattaches within a second or two of the kill at step 20: ample margin
    cfg = _vm_config(
        prepared_cfg,
        gcs_root,
        runtime.version,
        python,
        tmp_path / "vm",
        fake_tpu,
        sshd,
        tf_gcs_env,
        steps=steps,
        log_every=1,
        checkpoint_every=50,
        heartbeat_s=1,
    )
    config = cfg.model_dump(mode="json")

    def context(run_id, store, try_number):
        return {
            "dag": SimpleNamespace(dag_id="mlm_pretrain"),
            "run_id": run_id,
            "ti": SimpleNamespace(try_number=try_number),
            "task_state_store": store,
        }

    run_id = "manual__killed"
    run = RunPaths(gcs_root, run_id)
    fake_tpu.add_node("proj", ZONE, tpu.node_name("mlm_pretrain", run_id), state="READY")
    store = FileTaskState(tmp_path / "killed.json")
    first = start_train_task(config, run_id, store.path, tmp_path / "first_try.log", data=data)
    deadline = time.monotonic() + 600  # the first try installs the project on the "VM" too
    while (storage.read_json_if_exists(run.train_status) or {}).get("step", 0) < 20:
        assert first.poll() is None, (tmp_path / "first_try.log").read_text()
        assert time.monotonic() < deadline, "the first try's trainer never reached step 20"
        time.sleep(0.2)
    first.kill()  # SIGKILL: no on_kill, no hang-up of anything but the task's own sockets
    first.wait(timeout=10)
    killed_at = storage.read_json(run.train_status)["step"]
    capfd.readouterr()

    noticed: list[int] = []

    def preemption_notice() -> None:  # to the trainer the retry reattached to, past step 70
        while time.monotonic() < deadline + 600:
            record = storage.read_json_if_exists(run.train_status) or {}
            if record.get("step", 0) >= 70:
                os.kill(record["pid"], signal.SIGTERM)
                noticed.append(record["step"])
                return
            time.sleep(0.1)

    began = time.monotonic()
    notice = threading.Thread(target=preemption_notice, daemon=True)
    notice.start()
    run_deferrable(
        TrainOperator(task_id="train", config=config, data=data), lambda: context(run_id, store, 2), timeout=900
    )
    notice.join(timeout=10)
    log = capfd.readouterr().out
    reattached, _, restarted = log.partition("Restart 1 of at most")
    assert "Reattached to the trainer of try 1" in reattached and "Starting the trainer" not in reattached, log
    assert "Preemption notice (SIGTERM)" in restarted, log

    status = storage.read_json(run.train_status)
    summary = storage.read_json(run.train_summary)
    # Two trainers: try 1's (reattached by try 2), then the one try 2 started after the notice.
    assert (status["state"], status["step"], status["starts"], status["try_number"]) == ("done", steps, 2, 2)
    (restart,) = read_restarts(run)  # the notice: resumed at the step it arrived, not at the checkpoint of step 50
    assert restart["resumed_from"] == restart["step"] >= noticed[0] >= 70 and restart["steps_lost"] == 0, restart
    assert summary["resumed_from_step"] == restart["step"] and summary["steps"] == steps
    history = [json.loads(line) for line in storage.read_text(run.train_history).splitlines()]
    assert [h["step"] for h in history] == list(range(1, steps + 1))  # every step once: none lost, none repeated
    assert history[-1]["loss"] < history[0]["loss"]  # the resumed trainers went on learning
    reattach = log.split("Reattached to the trainer of try 1", 1)[1].split(" in ", 1)[1].split("s:", 1)[0]
    print(
        f"\nreal trainer: task SIGKILLed at step {killed_at}/{steps}; retry reattached in {reattach}s; preemption "
        f"notice at step {noticed[0]}, resumed at {restart['resumed_from']}; "
        f"finished {time.monotonic() - began:.1f}s later; steps lost 0, starts {status['starts']}, final loss "
        f"{summary['last_loss']:.6f}"
    )
