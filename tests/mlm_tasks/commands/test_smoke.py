"""The real-cloud smoke test's command (mlm_tasks.commands.smoke): its dry run prints every request and
command and sends nothing; a failing run still deletes its VM; its login accepts only the host key the
node published (against the fake TPU API and a real sshd)."""

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlm_tasks.commands import smoke as tpu_smoke
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh
from peers.sshd import host_public_key

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def ssh_key(tmp_path) -> str:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return str(key)


def test_dry_run_prints_every_request_and_command_and_sends_nothing(ssh_key, tmp_path):
    # No credentials anywhere and a bucket that does not exist: any real call would fail the run.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json"),
        "NO_PROXY": "*",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlm_tasks.commands.smoke",
            "--project",
            "my-proj",
            "--zone",
            "us-west4-a",
            "--bucket",
            "gs://no-such-bucket/smoke",
            "--ssh-key",
            ssh_key,
            "--run-id",
            "smoke-1",
            "--dry-run",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-1")
    node_url = "https://tpu.googleapis.com/v2/projects/my-proj/locations/us-west4-a/nodes"
    assert f"POST {node_url}?nodeId={name}" in out and f"DELETE {node_url}/{name}" in out
    body = json.loads(re.search(r"nodeId=\S+\n(\{.*?\n\})", out, re.S).group(1))
    assert body["acceleratorType"] == "v5litepod-1" and body["schedulingConfig"] == {"spot": True}
    assert body["metadata"]["enable-oslogin"] == "FALSE"
    public = Path(ssh_key + ".pub").read_text().split()
    assert body["metadata"]["ssh-keys"] == f"mlm:{public[0]} {public[1]} mlm"
    assert body["serviceAccount"] == {"scope": [tpu.SCOPE]}
    assert body["networkConfig"] == {"enableExternalIps": True}
    assert int(body["labels"]["expires"]) - int(body["labels"]["created"]) == 2 * 3600
    # The command the workers would run: the real bootstrap, then the train step on TPU.
    ssh = next(line for line in out.splitlines() if line.startswith("ssh "))
    # A line a person can paste: the login quoted (a bare <worker-0-ip> is a redirect), the command one argument.
    *opts, login, remote = shlex.split(ssh)
    assert opts == ["ssh", "-p", opts[2], "-i", ssh_key] and login == "mlm@<worker-0-ip>"
    assert "gs://no-such-bucket/smoke/_code/" in remote and "-m mlm_tasks train" in remote
    assert '"device":"tpu"' in remote
    # The DELETE comes last: teardown always.
    assert out.rindex("DELETE ") > out.index("POST ") and out.rindex("DELETE ") > out.index("ssh ")


def test_a_queued_dry_run_prints_the_queued_resource_request(ssh_key, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mlm_tasks.commands.smoke", "--project", "my-proj", "--zone", "us-west4-a", "--bucket"]
        + ["gs://no-such-bucket/smoke", "--ssh-key", ssh_key, "--run-id", "smoke-1", "--dry-run"]
        + ["--provisioning", "queued", "--set", "tpu.queued_valid_hours=3"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_PROXY": "*", "HTTPS_PROXY": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-1")
    url = "https://tpu.googleapis.com/v2/projects/my-proj/locations/us-west4-a/queuedResources"
    body = json.loads(re.search(r"queuedResourceId=\S+\n(\{.*?\n\})", out, re.S).group(1))
    assert f"POST {url}?queuedResourceId={name}" in out and out.rstrip().endswith(
        f"DELETE {url}/{name}?force=true\nDeleting TPU VM {name}: projects/my-proj/locations/us-west4-a/operations/"
        "dry-run-delete"
    )
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "10800s"}
    (spec,) = body["tpu"]["nodeSpec"]
    assert spec["nodeId"] == name and spec["node"]["acceleratorType"] == "v5litepod-1"
    assert "nodes?nodeId=" not in out  # no node created beside the request


@pytest.mark.parametrize("provisioning", ["spot", "queued"])
def test_a_failing_smoke_run_still_deletes_its_vm(ssh_key, fake_tpu, sa_key, gcs_root, tmp_path, capsys, provisioning):
    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps(sa_key))
    fake_tpu.external_ip = "127.0.0.2"  # nothing listens there: the port-22 probe fails after READY
    args = tpu_smoke.parse_args(
        [
            "--project",
            "proj",
            "--zone",
            "us-west4-a",
            "--bucket",
            gcs_root,
            "--ssh-key",
            ssh_key,
            "--run-id",
            "smoke-2",
            "--key-file",
            str(key_file),
            "--api-endpoint",
            fake_tpu.url,
            "--data-fingerprint",
            "0123456789abcdef",
            "--set",
            "tpu.poll_interval_s=0.05",
            "--provisioning",
            provisioning,
        ]
    )
    with pytest.raises(RuntimeError, match="unreachable.*firewall"):
        tpu_smoke.smoke(args)
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-2")
    assert fake_tpu.writes() == ["POST", "DELETE"], fake_tpu.requests
    assert fake_tpu.node("proj", "us-west4-a", name) is None and fake_tpu.queued == {}
    # queued: the request waited in the queue, then went with its node (force), nothing created beside it
    kind = "queuedResources" if provisioning == "queued" else "nodes"
    assert all(f"/{kind}" in path for method, path in fake_tpu.requests if method in ("POST", "DELETE"))
    assert f"Deleting TPU VM {name}" in capsys.readouterr().out
    assert fake_tpu.principals == {sa_key["client_email"]}


@pytest.mark.parametrize("published", ["the worker's key", "another machine's key"])
def test_the_smoke_login_accepts_only_the_host_key_the_node_published(
    published, sshd, fake_tpu, sa_key, gcs_root, tmp_path
):
    """The smoke tool pins the host keys the node publishes (guest attributes), as the DAG's SSH step does:
    a worker presenting another key is refused at once, before any command runs there; the VM is deleted."""
    from mlm_tasks import storage
    from mlm_tasks.paths import RunPaths

    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps(sa_key))
    if published == "another machine's key":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
        key_type, blob = (tmp_path / "other.pub").read_text().split()[:2]
        fake_tpu.host_keys = {key_type: blob}  # else the fake publishes the sshd's own key
    ran = tmp_path / "ran"
    python = tmp_path / "python"  # the VM's python, as a trainer that only says it ran
    python.write_text(f'#!/bin/sh\necho "$3 $*" > {ran}; echo trained\n')
    python.chmod(0o755)
    storage.write_json(RunPaths(gcs_root, "smoke-4").train_summary, {"steps": 12})  # what the trainer would write
    args = tpu_smoke.parse_args(
        [
            "--project",
            "proj",
            "--zone",
            "us-west4-a",
            "--bucket",
            gcs_root,
            "--ssh-key",
            sshd.key_path,
            "--ssh-user",
            sshd.user,
            "--ssh-via",
            "internal",
            "--run-id",
            "smoke-4",
            "--key-file",
            str(key_file),
            "--api-endpoint",
            fake_tpu.url,
            "--data-fingerprint",
            "0123456789abcdef",
            "--set",
            "tpu.poll_interval_s=0.05",
            "--set",
            f"tpu.ssh_port={sshd.port}",
            "--set",
            "tpu.bootstrap=false",
            "--set",
            f"tpu.python={python}",
            "--set",
            f"tpu.workdir={tmp_path / 'vm'}",
        ]
    )
    lines: list[str] = []
    started = time.monotonic()
    code = tpu_smoke.smoke(args, out=lines.append)
    out = "\n".join(lines)
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-4")
    assert ("POST", f"/v2/projects/proj/locations/us-west4-a/nodes/{name}:getGuestAttributes") in fake_tpu.requests
    assert fake_tpu.writes() == ["POST", "DELETE"] and fake_tpu.node("proj", "us-west4-a", name) is None
    if published == "the worker's key":
        assert code == 0, out
        assert "Trainer started detached: pid" in out and "Smoke PASSED: 12 steps" in out
        assert ran.read_text().startswith("train ")  # the trainer ran, detached, its output in its log file
    else:
        assert code == 1 and not ran.exists(), out
        assert (
            f"Smoke FAILED: worker 0 (127.0.0.1): HostKeyMismatch: The SSH host key of worker 0 "
            f"(127.0.0.1:{sshd.port}) does not match what node {name} published"
        ) in out
        assert time.monotonic() - started < 60, "a mismatch must not wait out the SSH patience"


def test_the_smoke_run_trains_detached_and_restarts_after_its_node_is_deleted(
    sshd, fake_tpu, sa_key, gcs_root, tmp_path
):
    """--preempt-after N: the smoke tool deletes its node at step N, as a preemption would take it; it replaces
    the node and a new detached trainer resumes from the last checkpoint, as the DAG's train task does."""
    import os
    import signal
    import threading

    from mlm_tasks.job.status import read_status
    from mlm_tasks.paths import RunPaths
    from peers.stand_in_trainer import steps_made, write_stand_in

    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps(sa_key))
    python = write_stand_in(tmp_path, step_s=0.1)
    run = RunPaths(gcs_root, "smoke-5")
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-5")
    settings = {
        "tpu.poll_interval_s": 0.05,
        "tpu.ssh_port": sshd.port,
        "tpu.bootstrap": "false",
        "tpu.python": python,
        "tpu.workdir": tmp_path / "vm",
        "tpu.env": json.dumps({"STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]}),  # the VM's gs://
        "train.steps": 60,
        "train.checkpoint_every": 5,
        "train.heartbeat_s": 1,
        "train.stall_minutes": 0.25,
        "train.follow_poll_s": 0.2,
    }
    args = tpu_smoke.parse_args(
        ["--project", "proj", "--zone", "us-west4-a", "--bucket", gcs_root, "--ssh-key", sshd.key_path]
        + ["--ssh-user", sshd.user, "--ssh-via", "internal", "--run-id", "smoke-5", "--key-file", str(key_file)]
        + ["--api-endpoint", fake_tpu.url, "--data-fingerprint", "0123456789abcdef", "--preempt-after", "23"]
        + [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    )

    def kill_with_the_node() -> None:  # a deleted VM's processes go with it (here they share one machine)
        while (status := read_status(run)) is None or fake_tpu.node("proj", "us-west4-a", name) is not None:
            time.sleep(0.02)
        os.killpg(os.getpgid(status["pid"]), signal.SIGKILL)

    threading.Thread(target=kill_with_the_node, daemon=True).start()
    lines: list[str] = []
    code = tpu_smoke.smoke(args, out=lines.append)
    out = "\n".join(lines)
    assert code == 0, out
    status = read_status(run)
    assert (status["state"], status["step"], status["starts"]) == ("done", 60, 2), status
    (restart,) = status["restarts"]
    assert restart["step"] >= 23 and restart["resumed_from"] % 5 == 0 and "NOT_FOUND" in restart["cause"], restart
    made = [step for _, step in steps_made(tmp_path / "vm", "smoke-5")]
    # Where the second trainer began: its first step, the checkpoint's next (the first may have made it too, or not
    # yet when the kill came right after a checkpoint).
    cut = len(made) - 1 - made[::-1].index(restart["resumed_from"] + 1)
    # The killed trainer may make a step past the last one its record showed before the node went (the kill races
    # it); the second resumes at the checkpoint either way and makes every later step once.
    assert made[:cut] == list(range(1, cut + 1)) and cut >= restart["step"], (made, restart)
    assert made[cut:] == list(range(restart["resumed_from"] + 1, 61)), (made, restart)
    assert "--preempt-after 23: deleting TPU VM" in out and "Restart 1: the TPU VM" in out
    assert "Smoke PASSED: 60 steps" in out and "1 restart(s)" in out
    creates = [path for method, path in fake_tpu.requests if method == "POST" and path.endswith("/nodes")]
    assert len(creates) == 2 and fake_tpu.nodes == {}  # the replacement, then the final delete


def test_smoke_module_imports_no_airflow():
    code = "import mlm_tasks.commands.smoke, sys; assert 'airflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT))


def test_sigterm_while_waiting_for_the_vm_still_deletes_it(ssh_key, fake_tpu, sa_key, gcs_root, gcs, tmp_path):
    import os
    import signal
    import time

    key_file = tmp_path / "sa.json"
    key_file.write_text(json.dumps(sa_key))
    fake_tpu.ready_after_gets = 10**6  # stays CREATING: the smoke run waits
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs.endpoint}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlm_tasks.commands.smoke",
            "--project",
            "proj",
            "--zone",
            "us-west4-a",
            "--bucket",
            gcs_root,
            "--ssh-key",
            ssh_key,
            "--run-id",
            "smoke-3",
            "--key-file",
            str(key_file),
            "--api-endpoint",
            fake_tpu.url,
            "--data-fingerprint",
            "0123456789abcdef",
            "--set",
            "tpu.poll_interval_s=0.2",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-3")
    deadline = time.monotonic() + 120
    while fake_tpu.node("proj", "us-west4-a", name) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fake_tpu.node("proj", "us-west4-a", name) is not None, "the smoke run never created its VM"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out[-3000:]
    assert fake_tpu.node("proj", "us-west4-a", name) is None and fake_tpu.writes() == ["POST", "DELETE"], out[-3000:]
    assert f"Deleting TPU VM {name}" in out and "Smoke FAILED: signal 15" in out


@pytest.mark.parametrize(
    "accelerator, runtime, pod",
    [
        ("v4-32", "tpu-vm-tf-2.16.1-pod-pjrt", True),
        ("v5litepod-16", "tpu-vm-tf-2.16.1-pod-pjrt", True),
        ("v5litepod-8", "tpu-vm-tf-2.16.1-pjrt", False),
    ],
)
def test_dry_run_shows_any_slice_before_paying_for_it(ssh_key, accelerator, runtime, pod):
    """A pod slice's exact request and remote line, read before one is bought: the -pod runtime is
    chosen for a multi-host type, and the line carries the pod's variables."""
    lines: list[str] = []
    args = tpu_smoke.parse_args(
        [
            "--project",
            "p",
            "--zone",
            "us-central2-b",
            "--bucket",
            "gs://bkt/smoke",
            "--ssh-key",
            ssh_key,
            "--run-id",
            "smoke-pod",
            "--accelerator",
            accelerator,
            "--capture-image",
            "--dry-run",
        ]
    )
    assert tpu_smoke.smoke(args, out=lines.append) == 0
    out = "\n".join(lines)
    body = json.loads(re.search(r"nodeId=\S+\n(\{.*?\n\})", out, re.S).group(1))
    assert (body["acceleratorType"], body["runtimeVersion"]) == (accelerator, runtime)
    ssh = [line for line in lines if line.startswith("ssh ")]
    assert "pip freeze --all" in ssh[0]  # --capture-image: the image's packages, before the bootstrap
    name = tpu.node_name(tpu_smoke.DAG_ID, "smoke-pod")
    assert ("export TPU_LOAD_LIBRARY=0" in ssh[1], f"export MLM_TPU_NODE={name}" in ssh[1]) == (pod, pod)
    assert ("export NEXT_PLUGGABLE_DEVICE_USE_C_API=true" in ssh[1]) == (not pod)


def test_capture_image_records_the_workers_packages_for_the_next_lock(sshd, tmp_path):
    """--capture-image over real SSH, on the simulated 2.16.1 image: its `pip freeze` becomes an image
    file marked as captured, which `make lock-vm` then takes as the image instead of a dated resolve."""
    import sys as _sys

    from mlm_tasks.config import PipelineConfig
    from mlm_tasks.tpu import runtimes
    from peers.tpu_vm_image import build

    _sys.path.insert(0, str(ROOT / "scripts"))
    import lock_vm

    python = build(runtimes.get("tpu-vm-tf-2.16.1-pjrt"))
    cfg = PipelineConfig.model_validate({"tpu": {"python": str(python), "ssh_port": sshd.port}})
    connect = ssh.connector(
        lambda host: ssh.Login(sshd.user, "test", {"key_filename": sshd.key_path}),
        sshd.port,
        node="mlm-smoke-x",
        published=lambda worker: dict([host_public_key(sshd)]),
    )
    lines: list[str] = []
    path = tpu_smoke.capture_image(cfg, "mlm-smoke-x", connect, sshd.host, lines.append, path=tmp_path / "image.txt")
    text = path.read_text()
    assert text.startswith(lock_vm.CAPTURED) and "Python 3.10.13" in text.splitlines()[0]
    assert "tensorflow==2.16.1" in text.splitlines() and "protobuf==4.25.3" in text.splitlines()
    assert not any(line.startswith("WARNING") for line in text.splitlines())
    assert lock_vm.pins(path)["typing-extensions"] == "4.11.0"
    assert "Captured" in lines[-1] and str(path) in lines[-1]
