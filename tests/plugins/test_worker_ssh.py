"""`ssh_connect` (plugins/mlm_airflow/connections.py) with mlm_tasks/tpu/ssh.py: the login to a worker, read
from the Airflow connection, pins the host key its node published (the fake TPU API serves the test sshd's real
host key, read back by the real google-cloud-tpu client), and each failure names its kind: host key, user and
key, or no answer."""

import functools
import logging
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow import connections
from mlm_airflow.operators import remote_step
from mlm_tasks.config import PipelineConfig
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu.ssh import Session
from peers.sshd import airflow_conn_uri, host_public_key
from peers.tpu_step_operator import TpuSSHStepOperator

ZONE = "us-central2-b"
PATIENCE_S = 4  # instead of 300 s: a login that cannot succeed fails within the test's patience


@pytest.fixture
def short_patience(monkeypatch):
    monkeypatch.setattr(remote_step, "ssh_connect", functools.partial(remote_step.ssh_connect, patience_s=PATIENCE_S))


def _readme_connection(monkeypatch, sshd, **changes):
    """The tpu_ssh connection as docs/google-cloud.md describes it: login user + private key, no extras."""
    server = sshd._replace(**changes)
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(server, no_host_key_check=False))


def _other_key(tmp_path, name: str) -> str:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


def _operator(fake_tpu, sshd, command="echo logged-in"):
    name = tpu.node_name("mlm_pretrain", "manual__1")
    fake_tpu.workers = 1
    fake_tpu.add_node("proj", ZONE, name, state="READY")
    cfg = PipelineConfig.model_validate(
        {
            "compute": "tpu_vm",
            "output_root": "gs://bucket/prefix",
            "tpu": {
                "project": "proj",
                "zone": ZONE,
                "api_endpoint": fake_tpu.url,
                "transport": "rest",
                "ssh_port": sshd.port,
                "bootstrap": False,
                "poll_interval_s": 0.1,
            },
        }
    )
    op = TpuSSHStepOperator(task_id="train", config=cfg.model_dump(mode="json"), command=command)
    return op, name, {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": "manual__1"}


def test_readme_connection_logs_in_pinning_the_published_host_key(fake_tpu, sshd, monkeypatch, short_patience, capfd):
    _readme_connection(monkeypatch, sshd)
    op, name, context = _operator(fake_tpu, sshd)
    assert op.execute(context) == {"node": name, "workers": 1}
    assert "[worker 0] logged-in" in capfd.readouterr().out
    assert ("POST", f"/v2/projects/proj/locations/{ZONE}/nodes/{name}:getGuestAttributes") in fake_tpu.requests


def test_a_host_key_the_node_did_not_publish_is_refused(fake_tpu, sshd, monkeypatch, tmp_path, short_patience):
    _readme_connection(monkeypatch, sshd)
    with open(_other_key(tmp_path, "other_host_key") + ".pub") as f:
        key_type, blob = f.read().split()[:2]
    fake_tpu.host_keys = {key_type: blob}  # the node published another machine's key
    op, name, context = _operator(fake_tpu, sshd)
    started = time.monotonic()
    with pytest.raises(AirflowFailException) as err:  # no retry: the same machine would answer
        op.execute(context)
    message = str(err.value)
    assert f"host key of worker 0 (127.0.0.1:{sshd.port}) does not match what node {name} published" in message
    assert "A different machine answered at that IP" in message and "user and key" not in message
    assert time.monotonic() - started < PATIENCE_S, "a mismatch must not wait out the SSH patience"


@pytest.mark.parametrize("wrong", ["user", "key"])
def test_a_refused_login_still_says_user_and_key(fake_tpu, sshd, monkeypatch, tmp_path, short_patience, wrong):
    change = {"user": "nobody-here"} if wrong == "user" else {"key_path": _other_key(tmp_path, "not_authorized")}
    _readme_connection(monkeypatch, sshd, **change)
    op, _, context = _operator(fake_tpu, sshd)
    with pytest.raises(AirflowException) as err:
        op.execute(context)
    message = str(err.value)
    assert "refused the login" in message and "check the connection's user and key" in message.lower()
    assert "host key" not in message


def test_the_opt_out_is_honoured_and_warned(fake_tpu, sshd, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))  # no_host_key_check=true
    fake_tpu.host_keys = {"ssh-ed25519": "AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    caplog.set_level(logging.WARNING, logger="mlm_airflow.connections")
    monkeypatch.setattr(connections, "_warned", set())  # warned once per process: not by an earlier test
    op, name, context = _operator(fake_tpu, sshd)
    assert op.execute(context) == {"node": name, "workers": 1}
    op.execute(context)
    warnings = [r for r in caplog.records if "sets no_host_key_check=true" in r.getMessage()]
    assert len(warnings) == 1  # once, not on every SSH session (a trigger polls every 30 s)


def test_host_keys_not_published_yet_are_waited_for_then_named(fake_tpu, sshd, monkeypatch):
    _readme_connection(monkeypatch, sshd)
    op, name, _ = _operator(fake_tpu, sshd)
    cfg = PipelineConfig.model_validate(op.config).tpu
    api = tpu.client(cfg)  # here: the SSH threads do not see this thread's credentials
    published = functools.partial(tpu.host_keys, cfg, name, api=api)
    key = dict([host_public_key(sshd)])
    fake_tpu.host_keys = {}
    late = connections.ssh_connect("tpu_ssh", sshd.port, patience_s=0.5, node=name, published=published, poll_s=0.1)
    outcome = Session(late, "127.0.0.1").run("true")
    assert f"Node {name} has published no SSH host keys for worker 0" in outcome.describe() and not outcome.fatal
    threading.Timer(0.5, lambda: setattr(fake_tpu, "host_keys", key)).start()  # the guest agent is up
    waits = connections.ssh_connect("tpu_ssh", sshd.port, patience_s=20, node=name, published=published, poll_s=0.1)
    assert Session(waits, "127.0.0.1").run("true").exit_code == 0


def test_an_unreachable_port_names_the_firewall(sshd, monkeypatch):
    _readme_connection(monkeypatch, sshd)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect = connections.ssh_connect(
        "tpu_ssh", port, patience_s=0, node="n", published=lambda worker: dict([host_public_key(sshd)])
    )
    message = Session(connect, "127.0.0.1").run("true").describe()
    assert f"Cannot SSH to 127.0.0.1:{port}" in message and "firewall allows" in message
    assert "user and key" not in message and "host key" not in message
