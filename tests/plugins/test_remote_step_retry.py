"""A retry meets the trainer of an earlier try whose SSH session died without a hang-up (a network
partition, a crashed Airflow host): the run lock of remote_command stops it first, over a real sshd.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/plugins/test_remote_step_retry.py -q
"""

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from mlm_airflow.connections import ssh_connect
from mlm_tasks.config import PipelineConfig
from mlm_tasks.tpu.bundle import remote_command
from mlm_tasks.tpu.ssh import Session
from peers.sshd import airflow_conn_uri
from peers.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
# The first try's Airflow side, in a process of its own so that the test can freeze it.
FIRST_TRY = """import logging, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/plugins"]
from mlm_tasks.tpu.ssh import Session
from mlm_airflow.connections import ssh_connect
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
Session(ssh_connect("tpu_ssh", int(sys.argv[2])), "127.0.0.1", on_line=logging.getLogger("first").info).run(sys.argv[3])
"""


def _writers(writes: Path) -> list[str]:
    """The pid of each line the stand-in trainers wrote, in order."""
    return [line.split()[0] for line in writes.read_text().splitlines()] if writes.exists() else []


def test_a_retry_stops_the_trainer_an_unnoticed_earlier_try_left(sshd, tmp_path, monkeypatch, caplog):
    workdir, writes, stop = tmp_path / "vm", tmp_path / "vm" / "writes", tmp_path / "stop"
    workdir.mkdir()
    # The VM's python, as a trainer: writes "pid step" to its checkpoint folder until told to stop.
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\n[ "$1 $2 $3" = "-m mlm_tasks train" ] || exit 9\n'
        f'i=0; while [ ! -f {stop} ]; do i=$((i+1)); echo "$$ $i" >> {writes}; sleep 0.1; done\n'
    )
    python.chmod(0o755)
    cfg = PipelineConfig.model_validate(
        {"tpu": {"bootstrap": False, "workdir": str(workdir), "python": str(python), "ssh_port": sshd.port}}
    )
    command = remote_command(cfg, "train", "manual__2025-01-01T00:00:00+00:00", node="mlm-n")
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))

    with open(tmp_path / "first.log", "wb") as out:
        first = subprocess.Popen(
            [sys.executable, "-c", FIRST_TRY, str(ROOT), str(sshd.port), command], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        old = wait_for("the first trainer", lambda: _writers(writes)[:1])[0]
        # SIGSTOP, not SIGKILL: the frozen client keeps its TCP connection open, as a partition would,
        # so sshd sees no hang-up and the first trainer keeps running.
        os.kill(first.pid, signal.SIGSTOP)
        written = len(_writers(writes))
        wait_for("the first trainer to go on writing", lambda: len(_writers(writes)) > written + 2, 10)

        caplog.set_level(logging.INFO, logger="test.retry")
        results = []
        log = logging.getLogger("test.retry")
        retry = threading.Thread(
            target=lambda: results.append(
                Session(
                    ssh_connect("tpu_ssh", sshd.port), "127.0.0.1", on_line=lambda line: log.info("[worker 0] %s", line)
                ).run(command)
            )
        )
        retry.start()
        new = wait_for("the retry's trainer", lambda: [p for p in _writers(writes) if p != old][:1])[0]
        wait_for("the retry's trainer to write", lambda: _writers(writes).count(new) >= 5, 20)
        wait_for("the first try's trainer to be gone", lambda: not Path(f"/proc/{old}").exists(), 10)
        stop.touch()
        retry.join(timeout=30)
        assert results and results[0].exit_code == 0, results and results[0].describe()
    finally:
        stop.touch()  # ends every stand-in trainer, also when the lock did not
        first.kill()  # a stopped process dies of SIGKILL too
        first.wait(timeout=10)

    logged = [r.getMessage() for r in caplog.records if r.name == "test.retry"]
    assert (
        f"[worker 0] Stopping the trainer left by an earlier try (pid {old}) of this run: SIGTERM, then "
        "SIGKILL after 60s." in logged
    )
    # One trainer at a time: the first one's last write comes before the retry's first.
    writers = _writers(writes)
    assert set(writers) == {old, new}
    assert writers.index(new) > len(writers) - 1 - writers[::-1].index(old)
