"""plugins/mlm_airflow/operators/remote_step.py and the session of mlm_tasks/tpu/ssh.py against a real sshd
(worker 0 of the TPU VM is this machine)."""

import logging
import re
import shlex
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException

from mlm_airflow.connections import ssh_connect
from mlm_tasks.config import PipelineConfig
from mlm_tasks.tpu.bundle import remote_command, stage_code
from mlm_tasks.tpu.ssh import Session
from peers.sshd import airflow_conn_uri, host_public_key
from peers.tpu_step_operator import TpuSSHStepOperator
from peers.tpu_vm_image import NO_LIBTPU
from peers.waits import error_text

ZONE = "us-central2-b"
POD = {"accelerator_type": "v4-32", "runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt"}


@pytest.fixture
def ssh_conn(sshd, monkeypatch):
    """The connection docs/google-cloud.md describes (user + key): the login pins the sshd's host key, which the
    fake TPU API also publishes for the operator's nodes."""
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd, no_host_key_check=False))
    return ssh_connect("tpu_ssh", sshd.port, node="mlm-test", published=lambda worker: dict([host_public_key(sshd)]))


def _cfg(fake_tpu, sshd, **tpu):
    """A config for worker 0 = this machine, which has no libtpu: tpu.env says so (NO_LIBTPU), as on the
    simulated image, unless a test sets its own env."""
    tpu.setdefault("env", NO_LIBTPU)
    return PipelineConfig.model_validate(
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
                **tpu,
            },
        }
    )


def _context(run_id="manual__1"):
    return {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": run_id}


def _ready_node(fake_tpu, workers=2):
    from mlm_tasks.tpu import api as tpu

    fake_tpu.workers = workers
    name = tpu.node_name("mlm_pretrain", "manual__1")
    fake_tpu.add_node("proj", ZONE, name, state="READY")
    return name


def _running(pattern):
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_streams_worker_0s_lines_and_keeps_the_tail(ssh_conn, caplog):
    log = logging.getLogger("test.remote")
    caplog.set_level(logging.INFO, logger="test.remote")
    outcome = Session(ssh_conn, "127.0.0.1", on_line=lambda line: log.info("[worker 0] %s", line)).run(
        "for i in 1 2 3; do echo line-$i; sleep 0.1; done; echo err-line >&2"
    )
    assert outcome.exit_code == 0 and outcome.error is None
    assert list(outcome.tail) == ["line-1", "line-2", "line-3", "err-line"]  # the pty merges stderr
    streamed = [r.getMessage() for r in caplog.records if r.name == "test.remote"]
    assert streamed == ["[worker 0] line-1", "[worker 0] line-2", "[worker 0] line-3", "[worker 0] err-line"]


def test_nonzero_exit_names_worker_and_code(ssh_conn):
    outcome = Session(ssh_conn, "127.0.0.1").run("echo about-to-fail; exit 3")
    assert outcome.exit_code == 3 and not outcome.fatal
    assert outcome.describe() == "worker 0 (127.0.0.1): exit code 3; last lines:\n    about-to-fail"


def _fake_python(tmp_path, body: str) -> str:
    """A stand-in for the VM's python: `-m mlm_tasks ...` runs `body` (shell) instead of a step."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m mlm_tasks" ]; then {body}\nfi\nexit 9\n')
    script.chmod(0o755)
    return str(script)


def test_pod_slice_runs_on_worker_0_addressing_the_node(fake_tpu, sshd, ssh_conn, tmp_path, capfd):
    """TensorFlow on TPU is single-client: on a multi-host slice only worker 0 runs the program, and
    its resolver names the node (MLM_TPU_NODE), zone and project instead of "local"."""
    name = _ready_node(fake_tpu, workers=4)
    out = tmp_path / "hits"
    python = _fake_python(tmp_path, f'echo "hit $MLM_TPU_NODE" >> {out}; echo done-here; exit 0')
    op = TpuSSHStepOperator(task_id="train", config=_cfg(fake_tpu, sshd, python=python, **POD).model_dump(mode="json"))
    assert op.execute(_context()) == {"node": name, "workers": 4}
    assert out.read_text().splitlines() == [f"hit {name}"]  # once, not once per host
    log = capfd.readouterr().out  # the task log (structlog -> stdout)
    assert "[worker 0] done-here" in log and "4-host slice: running 'train' on worker 0" in log


def test_single_host_runs_with_the_local_resolver(fake_tpu, sshd, ssh_conn, tmp_path):
    _ready_node(fake_tpu, workers=1)
    out = tmp_path / "hits"
    python = _fake_python(tmp_path, f'echo "hit ${{MLM_TPU_NODE:-local}}" >> {out}; exit 0')
    TpuSSHStepOperator(task_id="train", config=_cfg(fake_tpu, sshd, python=python).model_dump(mode="json")).execute(
        _context()
    )
    assert out.read_text().splitlines() == ["hit local"]


def test_a_step_on_the_vm_returns_the_result_its_cli_printed(fake_tpu, sshd, ssh_conn, tmp_path, caplog):
    """How evaluate, downstream and fill_mask run with compute tpu_vm: attached on the run's VM, their lines in
    the task log, their result the JSON the CLI prints last (indented on the session's pty); a VM no longer
    READY fails the task naming the fix."""
    from mlm_airflow.operators.remote_step import step_on_vm, step_result

    name = _ready_node(fake_tpu, workers=1)
    cli = "import json, sys; print('12:00:00 INFO fill -> x'); print(json.dumps([{'probe': sys.argv[1]}], indent=2))"
    python = _fake_python(tmp_path, f'shift 2; exec {sys.executable} -c "{cli}" "$@"')
    cfg = _cfg(fake_tpu, sshd, python=python)
    with caplog.at_level("INFO"):
        assert step_on_vm(_context(), cfg, "fill_mask") == [{"probe": "fill_mask"}]  # argv[1]: the verb given
    assert "[worker 0] 12:00:00 INFO fill -> x" in caplog.text
    assert step_result("evaluate", ["a log line", '{"loss": 1.5}', "exit noise"]) == {"loss": 1.5}  # one line
    with pytest.raises(AirflowException, match="ended without printing its result"):
        step_result("evaluate", ["Traceback (most recent call last):", "[1, 2"])
    fake_tpu.preempt(name)
    with pytest.raises(AirflowException, match="is PREEMPTED: 'evaluate' runs on the VM the model trained on"):
        step_on_vm(_context(), cfg, "evaluate")


def test_resolver_arguments_follow_the_remote_environment(monkeypatch):
    from mlm_tasks.training.device import tpu_resolver_args

    cfg = PipelineConfig.model_validate({"tpu": {"project": "proj", "zone": ZONE, **POD}})
    monkeypatch.delenv("MLM_TPU_NODE", raising=False)
    assert tpu_resolver_args(cfg) == {"tpu": "local"}
    monkeypatch.setenv("MLM_TPU_NODE", "mlm-pretrain-abc")
    assert tpu_resolver_args(cfg) == {"tpu": "mlm-pretrain-abc", "zone": ZONE, "project": "proj"}


@pytest.mark.parametrize(
    "workers, runtime, accelerator", [(2, "tpu-vm-tf-2.16.1-pjrt", "v4-8"), (1, "tpu-vm-tf-2.16.1-pod-pjrt", "v4-32")]
)
def test_host_count_and_runtime_must_agree(fake_tpu, sshd, ssh_conn, workers, runtime, accelerator):
    """validate refuses a mismatch of type and runtime; this is the run-time net for a node whose
    real host count (the API's endpoints) still disagrees with its runtime."""
    from airflow.sdk.exceptions import AirflowFailException

    _ready_node(fake_tpu, workers=workers)
    cfg = _cfg(fake_tpu, sshd, runtime_version=runtime, accelerator_type=accelerator)
    op = TpuSSHStepOperator(task_id="train", command="true", config=cfg.model_dump(mode="json"))
    with pytest.raises(AirflowFailException, match=f"has {workers} host\\(s\\) but runs {runtime}"):
        op.execute(_context())


def test_operator_failure_says_preempted(fake_tpu, sshd, ssh_conn):
    name = _ready_node(fake_tpu, workers=1)
    op = TpuSSHStepOperator(
        task_id="train", config=_cfg(fake_tpu, sshd).model_dump(mode="json"), command="sleep 1; echo dying; exit 7"
    )
    threading.Timer(0.3, fake_tpu.preempt, args=(name,)).start()
    with pytest.raises(AirflowException) as err:
        op.execute(_context())
    message = str(err.value)
    assert "exit code 7" in message and "worker 0" in message
    assert "PREEMPTED" in message and "dying" in message


def test_operator_refuses_a_node_that_is_not_ready(fake_tpu, sshd, ssh_conn):
    name = _ready_node(fake_tpu)
    fake_tpu.preempt(name)
    op = TpuSSHStepOperator(task_id="train", config=_cfg(fake_tpu, sshd).model_dump(mode="json"), command="true")
    with pytest.raises(AirflowException, match="PREEMPTED, not READY: clear create_tpu_vm"):
        op.execute(_context())


def test_kill_hangs_up_the_remote_step(fake_tpu, sshd, ssh_conn):
    _ready_node(fake_tpu, workers=1)
    marker = f"sleep {4000 + sshd.port % 1000}.5"
    op = TpuSSHStepOperator(
        task_id="train", config=_cfg(fake_tpu, sshd).model_dump(mode="json"), command=f"echo started; {marker}"
    )
    errors = []
    runner = threading.Thread(target=lambda: errors.append(error_text(op.execute, _context())))
    runner.start()
    deadline = time.monotonic() + 20
    while subprocess.run(["pgrep", "-c", "-f", marker], capture_output=True, text=True).stdout.strip() != "1":
        assert time.monotonic() < deadline, "remote steps did not start"
        time.sleep(0.1)
    op.on_kill()
    runner.join(timeout=20)
    assert not runner.is_alive()
    assert "hung up" in errors[0]
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(marker), "the remote process survived the kill"


def test_bootstrap_installs_staged_code_once(ssh_conn, tmp_path, fake_tpu, sshd):
    """The install path of remote_command, with a local output_root and a stand-in interpreter (the
    real one runs on the simulated image in test_simulated_tpu_vm.py)."""
    real_python = sys.executable
    wrapper = tmp_path / "python"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1 $2" = "-m pip" ]; then echo "PIP $*"; for a; do case "$prev" in --target) mkdir -p "$a";; esac; prev=$a; done; exit 0; fi
if [ "$1 $2" = "-m mlm_tasks.tpu.vm.check_image" ]; then echo "CHECK $3 $4 FORCE_TF_AVAILABLE=$FORCE_TF_AVAILABLE"; exit 0; fi
if [ "$1 $2" = "-m mlm_tasks" ]; then shift 2
  exec {real_python} -c 'import sys, mlm_tasks; print("FROM", mlm_tasks.__file__); print("ARGS", *sys.argv[1:2], sys.argv[-2:])' "$@"
fi
exec {real_python} "$@"
""")  # noqa: E501  (a shell script, one command a line)
    wrapper.chmod(0o755)
    root = tmp_path / "out"
    bundle = stage_code(str(root), "tpu-vm-tf-2.16.1-pjrt")
    pod = stage_code(str(root), "tpu-vm-tf-2.16.1-pod-pjrt")
    assert (pod.sha, pod.uri, pod.lock, pod.pod) == (bundle.sha, bundle.uri, bundle.lock, True)  # uploaded once
    assert (bundle.lock, bundle.tensorflow) == ("mlm_tasks/tpu/vm/requirements-tf2.16.txt", "2.16.1")
    workdir = tmp_path / "vm home" / "mlm"
    cfg = _cfg(fake_tpu, sshd, bootstrap=True, workdir=str(workdir), python=str(wrapper))
    command = remote_command(cfg, "train", "manual__1", node="mlm-n", code=bundle)

    first = list(Session(ssh_conn, "127.0.0.1").run(command).tail)
    assert first[0].startswith(f"Installing project {bundle.sha}")
    assert first[1] == "Installing requirements-tf2.16.txt beside the image TensorFlow"
    # Never TensorFlow, never the image's packages: --no-deps, only wheels, into a folder of its own.
    assert first[2] == (
        "PIP -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes "
        "--only-binary=:all: "
        f"--target deps-{bundle.lock_sha}.tmp -r code/mlm_tasks/tpu/vm/requirements-tf2.16.txt"
    )
    assert first[3] == f"CHECK 2.16.1 deps-{bundle.lock_sha}.tmp FORCE_TF_AVAILABLE=1"
    assert first[4] == f"FROM {workdir}/code/mlm_tasks/__init__.py"
    assert first[5] == "ARGS train ['--run-id', 'manual__1']"
    assert (workdir / f".installed-{bundle.sha}").exists() and (workdir / f"deps-{bundle.lock_sha}").is_dir()
    lock = (workdir / "code" / bundle.lock).read_text()
    assert "transformers==4.57.6" in lock and not re.search(r"(?m)^(tensorflow|numpy|protobuf)==", lock)

    again = Session(ssh_conn, "127.0.0.1").run(command)
    assert again.exit_code == 0 and list(again.tail) == first[4:]


def test_remote_command_carries_the_whole_config(fake_tpu, sshd):
    cfg = _cfg(fake_tpu, sshd, workdir="~/mlm dir")
    line = remote_command(cfg, "evaluate", "run 1", node="mlm-n", extra_args=["--x", "y"])
    argv = shlex.split(line.split("; exec ", 1)[1])
    assert argv[:4] == ["python3", "-m", "mlm_tasks", "evaluate"]
    assert PipelineConfig.model_validate_json(argv[argv.index("--config-json") + 1]) == cfg
    assert argv[-4:] == ["--run-id", "run 1", "--x", "y"]
    assert "cd \"$HOME\"/'mlm dir'" in remote_command(cfg, "train", "r", node="mlm-n")


def test_unreachable_worker_is_reported(sshd, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome = Session(ssh_connect("tpu_ssh", port, patience_s=0), "127.0.0.1").run("true")
    assert outcome.exit_code is None and not outcome.fatal
    assert f"Cannot SSH to 127.0.0.1:{port}" in outcome.describe()


def test_remote_command_exports_tpu_env(ssh_conn, fake_tpu, sshd, tmp_path):
    cfg = _cfg(
        fake_tpu,
        sshd,
        workdir=str(tmp_path),
        env={**NO_LIBTPU, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:1", "ODD": "a b'c"},
    )
    setup = remote_command(cfg, "train", "r", node="mlm-n").split("; exec ", 1)[0]  # everything before the step
    outcome = Session(ssh_conn, "127.0.0.1").run(setup + '; echo "$PWD|$STORAGE_EMULATOR_HOST|$ODD"')
    assert list(outcome.tail) == [f"{tmp_path}|http://127.0.0.1:1|a b'c"]


STEP_THAT_LOOKS = """#!/bin/sh
# The step's stand-in (tpu.python): reads the token from stdin as mlm_tasks' CLI does, then looks for it
# in every process's first environment (/proc/<pid>/environ) and prints what it found.
IFS= read -r token
hits=$(grep -lF "$token" /proc/[0-9]*/environ 2>/dev/null | wc -l)
echo "token ${#token} environ-hits $hits"
"""


def test_the_token_reaches_the_step_on_stdin_and_no_environment_holds_it(ssh_conn, fake_tpu, sshd, tmp_path):
    """Through a real sshd and pty: the line asks, the session answers on stdin with echo off, and while the
    step runs no process on the machine (the login shell, sshd's child, the step) holds the token in its
    environment block, which /proc keeps readable for a process's whole life. Without it: exit 3, why."""
    python = tmp_path / "python"
    python.write_text(STEP_THAT_LOOKS)
    python.chmod(0o755)
    cfg = _cfg(fake_tpu, sshd, workdir=str(tmp_path), python=str(python))
    command = remote_command(cfg, "train", "r", node="mlm-n", expect_token=True)
    token = "hf_" + "s3cret" * 6
    arrived = Session(ssh_conn, "127.0.0.1").run(command, secret=("MLM_SEND_HUB_TOKEN", token))
    assert arrived.exit_code == 0, arrived.describe()
    assert list(arrived.tail) == [f"token {len(token)} environ-hits 0"]  # no prompt, no echo of the token
    # The look can see: the same token sent the old way, in the session's environment (LC_*, which the
    # sshd accepts), sits in the login shell's environ block, and in the step's, for their whole lives.
    old_way = Session(ssh_conn, "127.0.0.1").run(
        command, env={"LC_MLM_HF_TOKEN": token}, secret=("MLM_SEND_HUB_TOKEN", token)
    )
    hits = int(old_way.tail[-1].rsplit(" ", 1)[1])
    assert hits >= 2, old_way.describe()
    dropped = Session(ssh_conn, "127.0.0.1").run(command, secret=("MLM_SEND_HUB_TOKEN", ""))
    assert dropped.exit_code == 3 and "The Hub token did not reach the VM" in dropped.describe()
