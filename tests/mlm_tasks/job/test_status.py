"""The trainer's status record (mlm_tasks/job/status.py): what it says while a trainer runs, when it
ends, when it is frozen; and how starts are counted across trainers of one run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlm_tasks.errors import ConfigError
from mlm_tasks.job.status import StatusRecord, read_status, stalled
from mlm_tasks.paths import RunPaths
from peers.waits import wait_for

ROOT = Path(__file__).resolve().parents[3]


def test_a_trainer_beats_reports_progress_and_ends_done(tmp_path, monkeypatch):
    monkeypatch.setenv("MLM_TRY_NUMBER", "3")
    run = RunPaths(str(tmp_path), "r1")
    assert read_status(run) is None
    with StatusRecord(run, total_steps=10, start_step=0, heartbeat_s=1) as status:
        first = read_status(run)
        assert (first["state"], first["step"], first["starts"], first["try_number"], first["pid"]) == (
            "running",
            0,
            1,
            3,
            os.getpid(),
        )
        status.progress(4, 2.5, 1000.0, 12.0)
        after = read_status(run)
        assert (after["step"], after["last_loss"], after["tokens_per_s"], after["eta_s"]) == (4, 2.5, 1000.0, 12.0)
        beat = wait_for(
            "a heartbeat", lambda: (s := read_status(run)) and s["heartbeat"] > after["heartbeat"] and s, 20
        )
        assert beat["step_time"] == after["step_time"]  # a heartbeat is not progress
    done = read_status(run)
    assert (done["state"], done["exit_code"], done["error"], done["step"]) == ("done", 0, None, 4)


@pytest.mark.parametrize("error, code", [(ConfigError("bad setting"), 2), (RuntimeError("boom"), 1)])
def test_a_failed_trainer_records_its_exit_code_and_the_next_one_counts_as_a_second_start(tmp_path, error, code):
    run = RunPaths(str(tmp_path), "r2")
    with pytest.raises(type(error)), StatusRecord(run, total_steps=10, start_step=0, heartbeat_s=5):
        raise error
    failed = read_status(run)
    assert (failed["state"], failed["exit_code"], failed["starts"]) == ("failed", code, 1)
    assert str(error) in failed["error"]
    with StatusRecord(run, total_steps=10, start_step=5, heartbeat_s=5):
        again = read_status(run)
    assert (again["state"], again["step"], again["starts"], again["exit_code"]) == ("running", 5, 2, None)
    assert read_status(run)["state"] == "done"


def test_stalled_names_a_stale_heartbeat_or_a_stale_step():
    now = 10_000.0
    record = {"state": "running", "heartbeat": now - 5, "step_time": now - 5, "step": 7, "pid": 42, "host": "w0"}
    assert stalled(record, stall_s=60, now=now) is None
    assert "no heartbeat for 100s" in stalled({**record, "heartbeat": now - 100}, stall_s=60, now=now)
    assert "no new step for 100s" in stalled({**record, "step_time": now - 100}, stall_s=60, now=now)
    assert stalled({**record, "state": "done", "heartbeat": 0.0}, stall_s=60, now=now) is None


def test_a_frozen_trainer_stops_beating_and_counts_as_stalled(tmp_path):
    """A real process whose status thread beats every 0.5 s, frozen with SIGSTOP, then let go."""
    code = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from mlm_tasks.job.status import StatusRecord\nfrom mlm_tasks.paths import RunPaths\n"
        f"with StatusRecord(RunPaths({str(tmp_path)!r}, 'frozen'), total_steps=5, start_step=0, heartbeat_s=0.5):\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    run = RunPaths(str(tmp_path), "frozen")
    try:
        wait_for("the first record", lambda: read_status(run), 20)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.6)  # a beat in flight lands
        frozen_at = read_status(run)["heartbeat"]
        time.sleep(2.5)
        record = read_status(run)
        assert record["heartbeat"] == frozen_at  # no beat while frozen
        assert "no heartbeat" in stalled(record, stall_s=2)
        proc.send_signal(signal.SIGCONT)
        resumed = wait_for(
            "a heartbeat after SIGCONT", lambda: (s := read_status(run)) and s["heartbeat"] > frozen_at and s, 20
        )
        assert "no new step" in stalled(resumed, stall_s=2)  # alive again, but no step since it started
    finally:
        proc.kill()
        proc.wait(timeout=10)
