"""What a detached trainer's state means (mlm_tasks/training/follow.py): the follow loop's and a retry's
decisions, from (handle, status record, probe, node state, clock) alone."""

import logging
from types import SimpleNamespace

import pytest

from mlm_tasks.tpu.job import Probe, parse_probe
from mlm_tasks.training.follow import NodeLost, Verdict, classify, reattach

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
        assert (verdict.kind, verdict.exit_code) == ("lost", 75) and "checkpoint saved at step 40" in verdict.detail


def test_probe_answers():
    assert parse_probe(["noise", "MLM_PROBE alive"]) == Probe(True)
    assert parse_probe(["MLM_PROBE gone 3"]) == Probe(False, 3)
    assert parse_probe(["MLM_PROBE gone -"]) == Probe(False, None)
    assert parse_probe([], "Cannot SSH").alive is None


def test_a_node_lost_between_its_check_and_the_reattach_is_no_place_to_start():
    """The node was READY when the task looked, and is PREEMPTED when the reattach checks the trainer: starting
    a trainer there would run on a dead node, uncounted. NodeLost sends the task to its restart instead."""
    lost = Verdict("lost", "the TPU VM mlm-n is PREEMPTED: the trainer is lost with it")
    watch = SimpleNamespace(job=JOB, log=logging.getLogger("test"), check=lambda: lost, stop=lambda: None)
    with pytest.raises(NodeLost, match="PREEMPTED"):
        reattach(watch, node=JOB["node"], host=JOB["host"])
    running = SimpleNamespace(**{**vars(watch), "check": lambda: Verdict("running", "step 40/100")})
    assert reattach(running, node=JOB["node"], host=JOB["host"]) is True
    # A trainer that saved a checkpoint on a preemption notice and exited 75, its node READY (a maintenance
    # event): a new trainer starts from that checkpoint. Read as a lost node, each restart would find the same
    # record and restart again, until train.max_restarts (found on the simulated TPU VM image).
    noticed = Verdict("lost", "the trainer stopped on a preemption notice: checkpoint saved at step 71", 75)
    after_notice = SimpleNamespace(**{**vars(watch), "check": lambda: noticed})
    assert reattach(after_notice, node=JOB["node"], host=JOB["host"]) is False


def test_a_node_replaced_under_the_same_name_and_address_took_its_trainer_with_it():
    """A preempted node replaced by the task's check-in (or a cleared create_tpu_vm) can come back with the same
    name and internal address: its createTime differs. The stored trainer is lost with the old node, a restart
    to count and record; read as "ended" it was followed by a new trainer with the loss in no record."""
    running = SimpleNamespace(job=JOB, log=logging.getLogger("test"), check=lambda: Verdict("running", "step 40/100"))
    assert reattach(running, node=JOB["node"], host=JOB["host"], created=JOB["node_created"]) is True
    with pytest.raises(NodeLost, match="replaced by mlm-n"):
        reattach(running, node=JOB["node"], host=JOB["host"], created=NOW - 50)
    with pytest.raises(NodeLost, match="ran on mlm-n .10.0.0.2"):
        reattach(running, node=JOB["node"], host="10.0.0.3", created=JOB["node_created"])
    # A handle of an older try, without node_created: the name and the address decide.
    older = SimpleNamespace(**{**vars(running), "job": {k: v for k, v in JOB.items() if k != "node_created"}})
    assert reattach(older, node=JOB["node"], host=JOB["host"], created=NOW - 50) is True
