"""mlm_tasks/tpu/ssh.py, the one SSH path (the DAG's step runner and the smoke tool), without Airflow: the port
probe, and the login pinned to the host key the node published, against a real sshd on loopback."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlm_tasks.errors import AuthError, ConfigError
from mlm_tasks.tpu import ssh
from peers.sshd import host_public_key

ROOT = Path(__file__).resolve().parents[3]


def test_the_ssh_module_imports_no_airflow():
    code = "import mlm_tasks.tpu.ssh, sys; assert 'airflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


def _silent_port():
    """A loopback port that never answers a SYN, like a firewall that drops packets: a listener
    with a full accept queue (Linux then drops further SYNs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):  # fill the queue; later connects hang
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(listener.getsockname())
        fillers.append(s)
    return listener, fillers


def test_probe_tells_a_dropping_firewall_from_a_refusal(sshd):
    listener, fillers = _silent_port()
    silent_port = listener.getsockname()[1]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]  # bound, not listening: connects are refused
        started = time.monotonic()
        silent = ssh.unreachable("127.0.0.1", silent_port, timeout_s=1)
        refused = ssh.unreachable("127.0.0.1", closed_port, timeout_s=1)
    elapsed = time.monotonic() - started
    for s in (listener, *fillers):
        s.close()
    assert silent == f"127.0.0.1:{silent_port}: no answer within 1s (packets dropped: firewall?)"
    assert refused == f"127.0.0.1:{closed_port}: connection refused for 1s"  # retried until the timeout
    assert elapsed < 5
    assert ssh.unreachable(sshd.host, sshd.port, timeout_s=1) is None


def _login(sshd):
    return ssh.Login(
        sshd.user,
        "the test's login",
        {"key_filename": sshd.key_path, "timeout": 10, "allow_agent": False, "look_for_keys": False},
    )


def _another_key(tmp_path) -> dict:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key_type, blob = (tmp_path / "k.pub").read_text().split()[:2]
    return {key_type: blob}


def test_the_login_runs_only_where_the_published_host_key_answers(sshd, tmp_path):
    published = {"mlm-n": dict([host_public_key(sshd)]), "mlm-other": _another_key(tmp_path)}

    def session(node):
        connect = ssh.connector(
            lambda host: _login(sshd),
            sshd.port,
            node=node,
            patience_s=30,
            poll_s=1,
            published=lambda worker: published[node],
        )
        return ssh.Session(connect, sshd.host).run(f"echo ran-on {node}")

    ok = session("mlm-n")
    assert (ok.exit_code, list(ok.tail)) == (0, ["ran-on mlm-n"])
    started = time.monotonic()
    refused = session("mlm-other")
    assert time.monotonic() - started < 10, "a mismatch must not wait out the patience"
    assert refused.exit_code is None and refused.fatal and not refused.tail
    assert (
        f"HostKeyMismatch: The SSH host key of worker 0 ({sshd.host}:{sshd.port}) does not match what node "
        "mlm-other published" in refused.describe()
    )
    assert issubclass(ssh.HostKeyMismatch, AuthError)  # no retry: the same machine would answer


def test_keys_replaced_on_first_boot_are_read_again_once(sshd, tmp_path, caplog):
    """A first boot may replace the host keys after the agent published the first ones: the mismatch reads
    the node's keys once more, and logs in against the new ones; a key still unpublished then fails."""
    asked: list[int] = []
    real, stale = dict([host_public_key(sshd)]), _another_key(tmp_path)

    def published(worker):  # the keys of the first boot, then those the agent publishes after the change
        asked.append(worker)
        return stale if len(asked) == 1 else real

    connect = ssh.connector(
        lambda host: _login(sshd), sshd.port, node="mlm-n", patience_s=30, poll_s=0.2, published=published
    )
    with caplog.at_level("WARNING"):
        ok = ssh.Session(connect, sshd.host).run("echo past-the-new-keys")
    assert (ok.exit_code, list(ok.tail), len(asked)) == (0, ["past-the-new-keys"], 2)
    assert "it now publishes others (a first boot replacing its keys)" in caplog.text

    asked.clear()
    always_stale = ssh.connector(
        lambda host: _login(sshd), sshd.port, node="mlm-n", patience_s=30, poll_s=0.2, published=lambda w: stale
    )
    refused = ssh.Session(always_stale, sshd.host).run("true")
    assert refused.fatal and "does not match what node mlm-n published" in refused.describe()


def test_without_published_keys_the_login_needs_the_opt_out(sshd):
    connect = ssh.connector(lambda host: _login(sshd), sshd.port, node="mlm-n", published=None)
    with pytest.raises(ConfigError, match="No host keys to check"):
        connect(sshd.host)
    opted_out = ssh.Login(**{**vars(_login(sshd)), "no_host_key_check": True})
    connect = ssh.connector(lambda host: opted_out, sshd.port, node="mlm-n", published=None)
    assert ssh.Session(connect, sshd.host).run("true").exit_code == 0
