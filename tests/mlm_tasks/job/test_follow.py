"""What a detached trainer's state means (mlm_tasks/job/follow.py), from (handle, status record, probe, node
state, clock) alone; what to do about it: test_decide.py."""

import pytest

from mlm_tasks.job.follow import classify
from mlm_tasks.job.launch import Probe, parse_probe

NOW = 1_000_000.0
JOB = {
    "node": "mlm-n",
    "node_created": NOW - 200,
    "host": "10.0.0.2",
    "worker": 0,
    "pid": 4242,
    "try_number": 2,
    "log": "logs/t.log",
    "workdir": "~/mlm",
    "run_id": "r",
    "started_at": NOW - 100,
    "starts_before": 1,
}


def _status(**changes):
    record = {
        "state": "running",
        "step": 40,
        "total_steps": 100,
        "last_loss": 2.5,
        "tokens_per_s": 1234.0,
        "eta_s": 600.0,
        "heartbeat": NOW - 5,
        "heartbeat_utc": "",
        "step_time": NOW - 5,
        "try_number": 2,
        "host": "vm",
        "pid": 4243,
        "starts": 2,
        "exit_code": None,
        "error": None,
    }
    return {**record, **changes}


ALIVE = Probe(True)


def _kind(status, probe=ALIVE, stall_s=600, node_state=None):
    return classify(JOB, status, probe, now=NOW, stall_s=stall_s, node_state=node_state)


def test_a_beating_trainer_runs_and_says_where_it_is():
    verdict = _kind(_status())
    assert (verdict.kind, verdict.detail) == ("running", "step 40/100, loss 2.5000, 1234 tokens/s, ETA 10m00s")


@pytest.mark.parametrize("record", [_status(try_number=1), _status(starts=1), None])
def test_a_record_another_trainer_left_is_not_this_ones_progress(record):
    assert _kind(record).kind == "starting"  # alive, started 100 s ago, no record of its own
    assert _kind(record, stall_s=99).kind == "stalled"  # ... for longer than stall_minutes
    assert _kind(_status(state="done", try_number=1)).kind == "starting"


def test_endings():
    assert _kind(_status(state="done", exit_code=0), Probe(False, 0)).kind == "done"
    failed = _kind(_status(state="failed", exit_code=2, error="NoRetryError: bad"), Probe(False, 2))
    assert (failed.kind, failed.exit_code) == ("failed", 2) and "NoRetryError: bad" in failed.detail
    assert _kind(None, Probe(False, 0)).kind == "done"  # found the run finished: exits 0, writes no record
    killed = _kind(_status(), Probe(False, None))
    assert (killed.kind, killed.exit_code) == ("failed", None) and "without an exit code" in killed.detail
    assert _kind(_status(), Probe(False, 137)).detail.endswith("exited with code 137")


def test_stalls_and_a_lost_node():
    assert "no heartbeat for 70s" in _kind(_status(heartbeat=NOW - 70), stall_s=60).detail
    assert _kind(_status(step_time=NOW - 70), stall_s=60).kind == "stalled"  # beats, but no step
    assert _kind(_status(heartbeat=NOW - 70), Probe(None), stall_s=60).kind == "stalled"
    assert _kind(_status(), Probe(None)).kind == "running"  # SSH down: the record still tells
    lost = _kind(_status(), Probe(None), node_state="PREEMPTED")
    assert lost.kind == "lost" and "PREEMPTED" in lost.detail  # a restart inside the try, not a failure
    # A trainer that answered a preemption notice with a checkpoint: a restart from it, on any node state.
    noticed = _status(state="preempted", exit_code=75, error="Preemption notice (SIGTERM): checkpoint saved at step 40")
    for node_state in (None, "READY", "PREEMPTED"):
        verdict = _kind(noticed, Probe(False, exit_code=75), node_state=node_state)
        assert verdict.kind == "lost" and "checkpoint saved at step 40" in verdict.detail


def test_the_nodes_word_comes_before_the_trainers_record():
    """Issue 48: the TPU runtime erroring as its host goes down is recorded as "failed"; a node PREEMPTED under
    it makes it lost (a restart), its own words kept in the detail."""
    failed = _status(state="failed", exit_code=1, error="RuntimeError: TPU runtime: connection reset")
    assert _kind(failed, Probe(False, 1), node_state="READY").kind == "failed"
    lost = _kind(failed, Probe(False, 1), node_state="PREEMPTED")
    assert lost.kind == "lost" and "PREEMPTED" in lost.detail and "TPU runtime: connection reset" in lost.detail
    done = _kind(_status(state="done", exit_code=0), Probe(False, 0), node_state="PREEMPTED")
    assert done.kind == "done"  # finished before its node went


def test_probe_answers():
    assert parse_probe(["noise", "MLM_PROBE alive"]) == Probe(True)
    assert parse_probe(["MLM_PROBE gone 3"]) == Probe(False, 3)
    assert parse_probe(["MLM_PROBE gone -"]) == Probe(False, None)
    assert parse_probe([], "Cannot SSH").alive is None
