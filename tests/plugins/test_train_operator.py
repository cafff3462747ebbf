"""plugins/mlm_airflow/operators/train.py on the TPU path: a retry after a preemption replaces the node itself
(create_tpu_vm, a setup task, is not rerun by Airflow), then runs the step over a real sshd.

    python -m pytest tests/plugins/test_train_operator.py -q
"""

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.operators.train import TrainOperator
from mlm_tasks.tpu import api as tpu
from peers.deferral import run_deferrable
from peers.sshd import airflow_conn_uri
from peers.tpu_step_operator import TpuSSHStepOperator

ZONE = "us-central2-b"
RUN = "manual__1"
NAME = tpu.node_name("mlm_pretrain", RUN)


@pytest.fixture
def ssh_conn(sshd, gcs, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))


def _config(fake_tpu, sshd, tmp_path, **tpu_settings):
    # The train task follows the trainer every 0.2 s (its status record in output_root, on the emulator).
    return {
        "compute": "tpu_vm",
        "output_root": "gs://bucket/p",
        "train": {"follow_poll_s": 0.2},
        "tpu": {
            "project": "proj",
            "zone": ZONE,
            "api_endpoint": fake_tpu.url,
            "transport": "rest",
            "poll_interval_s": 0.05,
            "bootstrap": False,
            "ssh_port": sshd.port,
            "workdir": str(tmp_path / "vm"),
            **tpu_settings,
        },
    }


def _trainer_log(tmp_path, try_number=1):
    """What the detached trainer wrote to its log file on the VM."""
    from mlm_tasks.job.launch import log_name

    return (tmp_path / "vm" / log_name(RUN, try_number)).read_text().splitlines()


DATA = {"fingerprint": "fp123"}  # merge_shards' result, as the DAG hands it to train


def _context():
    return {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": RUN}


def _run(op):
    return run_deferrable(op, _context, timeout=30)


def test_retry_after_preemption_replaces_the_node_then_trains(fake_tpu, sshd, ssh_conn, tmp_path):
    fake_tpu.delete_after_gets = 2  # the dead node lingers in DELETING for a while, as on GCP
    fake_tpu.add_node("proj", ZONE, NAME, labels={"run": "first-try"})
    fake_tpu.preempt(NAME)
    # /bin/echo as the VM's python: the worker prints the exact step line it was given.
    op = TrainOperator(task_id="train", data=DATA, config=_config(fake_tpu, sshd, tmp_path, python="/bin/echo"))
    assert _run(op) == {"node": NAME, "workers": 1}

    methods = [m for m, _ in fake_tpu.requests]
    assert methods.count("DELETE") == 1 and methods.count("POST") == 1
    assert methods.index("DELETE") < methods.index("POST")
    node = fake_tpu.node("proj", ZONE, NAME)
    assert node["state"] == "READY" and node["labels"]["run"] != "first-try"
    line = _trainer_log(tmp_path)[-1]
    assert line.startswith("-m mlm_tasks train --config-json ")
    assert line.endswith(f"--run-id {RUN} --data-fingerprint fp123")


def test_replacement_that_fails_deletes_it_and_fails_the_try(fake_tpu, sshd, ssh_conn, tmp_path):
    fake_tpu.add_node("proj", ZONE, NAME)
    fake_tpu.preempt(NAME)
    fake_tpu.fail_next_create("Internal error: the node's boot disk could not be attached")  # no stockout
    op = TrainOperator(task_id="train", data=DATA, config=_config(fake_tpu, sshd, tmp_path, python="/bin/echo"))
    with pytest.raises(AirflowException, match="boot disk could not be attached.*deleted it"):
        _run(op)
    assert fake_tpu.nodes == {}


def test_a_replacement_met_by_a_stockout_waits_for_capacity_then_trains_in_the_same_try(
    fake_tpu, sshd, ssh_conn, tmp_path
):
    """Issue 31: the node is preempted and the zone has no capacity for the first re-create; the train task
    waits 20 node polls (deferred), creates again and starts the trainer, without failing its try."""
    fake_tpu.add_node("proj", ZONE, NAME)
    fake_tpu.preempt(NAME)
    fake_tpu.fail_next_create("There is no more capacity in the zone")
    config = _config(fake_tpu, sshd, tmp_path, python="/bin/echo")
    op = TrainOperator(task_id="train", data=DATA, config=config)
    assert _run(op) == {"node": NAME, "workers": 1}
    writes = [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")]
    assert writes == ["DELETE", "POST", "DELETE", "POST"], writes  # the preempted node, the stockout's, the READY one
    assert fake_tpu.node("proj", ZONE, NAME)["state"] == "READY"
    assert _trainer_log(tmp_path)[-1].startswith("-m mlm_tasks train --config-json ")


def test_plain_step_operator_does_not_replace_nodes(fake_tpu, sshd, ssh_conn, tmp_path):
    fake_tpu.add_node("proj", ZONE, NAME)
    fake_tpu.preempt(NAME)
    op = TpuSSHStepOperator(task_id="evaluate", config=_config(fake_tpu, sshd, tmp_path), command="true")
    with pytest.raises(AirflowException, match="PREEMPTED, not READY"):
        op.execute(_context())
    assert [m for m, _ in fake_tpu.requests] == ["GET"]


def test_configuration_error_on_the_vm_fails_without_retry(fake_tpu, sshd, ssh_conn, tmp_path):
    fake_tpu.add_node("proj", ZONE, NAME)
    op = TrainOperator(
        task_id="train",
        data=DATA,
        config=_config(fake_tpu, sshd, tmp_path),
        command="echo 'error: Global batch 4096 is larger than the 300 train records' >&2; exit 2",
    )
    with pytest.raises(AirflowFailException, match=r"(?s)exit code 2.*Global batch 4096.*no retry can fix"):
        _run(op)
    op = TrainOperator(task_id="train", data=DATA, config=_config(fake_tpu, sshd, tmp_path), command="exit 1")
    with pytest.raises(AirflowException) as err:
        _run(op)
    assert not isinstance(err.value, AirflowFailException)  # other failures are retried


def test_local_training_gets_the_hub_token_from_the_connection_as_an_argument(monkeypatch):
    """publish.sync_checkpoints: the train task hands the Hub connection's token (and host) to train() as
    arguments; HF_TOKEN never appears in the task's environment, during training or after."""
    import os

    import mlm_tasks.steps.train

    seen = {}
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT",
        json.dumps({"conn_type": "generic", "password": "hf_planted_sync", "host": "http://127.0.0.1:9"}),
    )

    def fake_train(cfg, ctx, **kwargs):
        seen.update(kwargs, fp=ctx.fingerprint, env_token=os.environ.get("HF_TOKEN"))
        return {"steps": 1}

    monkeypatch.setattr(mlm_tasks.steps.train, "train", fake_train)
    config = {"publish": {"sync_checkpoints": True, "repo_id": "org/model"}}
    op = TrainOperator(task_id="train", data=DATA, config=config)
    assert op.execute(_context()) == {"steps": 1}
    assert seen == {
        "hub_token": "hf_planted_sync",
        "hub_endpoint": "http://127.0.0.1:9",
        "fp": "fp123",
        "env_token": None,
    }
    assert "HF_TOKEN" not in os.environ

    seen.clear()  # sync off: no connection needed, no token passed
    monkeypatch.delenv("AIRFLOW_CONN_HUGGINGFACE_DEFAULT")
    assert TrainOperator(task_id="train", data=DATA, config={}).execute(_context()) == {"steps": 1}
    assert seen["hub_token"] is None and "HF_TOKEN" not in os.environ


def test_hub_credentials_from_the_connection_say_what_is_missing(monkeypatch):
    from mlm_airflow.connections import hub_credentials

    monkeypatch.setenv("AIRFLOW_CONN_HF_OK", json.dumps({"conn_type": "generic", "password": "hf_x"}))
    assert hub_credentials("hf_ok") == ("hf_x", None)
    monkeypatch.setenv("AIRFLOW_CONN_HF_EMPTY", json.dumps({"conn_type": "generic", "host": "http://h"}))
    with pytest.raises(AirflowFailException, match="'hf_empty' has no password"):
        hub_credentials("hf_empty")
    with pytest.raises(AirflowFailException, match="No Airflow connection 'hf_absent'"):
        hub_credentials("hf_absent")


def test_tpu_vm_training_gets_the_hub_token_through_the_ssh_session_only(
    fake_tpu, sshd, ssh_conn, tmp_path, monkeypatch, capfd
):
    """On a TPU VM the token travels on the SSH session's stdin when the line asks, and the step reads it
    from its own stdin (--hub-token-stdin); it is never in the step's environment, on a command line (`ps`
    of the VM), in the task log or in the task's XCom."""
    import hashlib
    import subprocess
    import threading

    token = "hf_planted_vm_sync_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]
    monkeypatch.setenv(
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT",
        json.dumps({"conn_type": "generic", "password": token, "host": "http://127.0.0.1:9"}),
    )
    step = tmp_path / "python"  # the VM's python: reports what the train step would see, then lingers
    step.write_text(
        "#!/bin/sh\nIFS= read -r token\n"
        'echo "sha=$(printf %s "$token" | sha256sum | cut -c1-16) env=${HF_TOKEN:-unset} '
        'endpoint=$HF_ENDPOINT args=$#"\nsleep 2\n'
    )
    step.chmod(0o755)
    fake_tpu.add_node("proj", ZONE, NAME)
    config = {
        **_config(fake_tpu, sshd, tmp_path, python=str(step)),
        "publish": {"sync_checkpoints": True, "repo_id": "org/model"},
    }
    op = TrainOperator(task_id="train", data=DATA, config=config)
    seen_in_ps = []

    def watch_ps():
        for _ in range(15):
            seen_in_ps.append(subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout)
            threading.Event().wait(0.1)

    watcher = threading.Thread(target=watch_ps)
    watcher.start()
    xcom = _run(op)
    watcher.join()
    log = capfd.readouterr().out + capfd.readouterr().err

    want = hashlib.sha256(token.encode()).hexdigest()[:16]
    assert _trainer_log(tmp_path)[-1].startswith(f"sha={want} env=unset endpoint=http://127.0.0.1:9 args=")
    assert any("mlm_tasks train" in snapshot for snapshot in seen_in_ps), "ps never saw the step running"
    assert not any(token in snapshot for snapshot in seen_in_ps)
    assert token not in log and token not in json.dumps(xcom)
