"""The driver's one decision (mlm_tasks/job/decide.py): one scenario table, decided by `decide` and driven
through both front ends, the Airflow train task (plugins/mlm_airflow/operators/train.py) and the smoke
command (mlm_tasks/commands/smoke_train.py), which must take the same decisions and answer each as theirs:
a failure raises (AirflowFailException where no retry helps), done returns, the rest goes on (a deferral or a
sleep). What each front end does with the world (the fake TPU API, a real sshd): the stack tests beside them."""

import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from mlm_airflow.operators import tpu_vm
from mlm_airflow.operators import train as airflow_front
from mlm_airflow.operators.train import TrainOperator
from mlm_tasks.commands import smoke_train as smoke_front
from mlm_tasks.commands.smoke_train import SmokeDriver, TrainingFailed
from mlm_tasks.config import build_config
from mlm_tasks.job.decide import Facts, decide
from mlm_tasks.job.follow import Verdict
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu.calls import capacity

NOW = 1_000_000.0
JOB = {
    "node": "mlm-n",
    "node_created": NOW - 200,
    "host": "10.0.0.2",
    "worker": 0,
    "pid": 4242,
    "try_number": 1,
    "log": "logs/t.log",
    "workdir": "~/mlm",
    "run_id": "r",
    "started_at": NOW - 100,
    "starts_before": 0,
}
RUNNING = Verdict("running", "step 40/100, loss 2.5000")
FAILED = Verdict("failed", "the trainer (pid 4242, try 1) on mlm-n failed: RuntimeError: TPU runtime went away", 1)
GONE = Verdict("failed", "the trainer (pid 4242, try 1) on mlm-n is gone without an exit code")
BAD_INPUT = Verdict("failed", "the trainer failed: NoRetryError: bad input at step 4", 2)
STALLED = Verdict("stalled", "no heartbeat for 70s (train.stall_minutes is 1)")
NOTICE = Verdict("lost", "the trainer stopped on a preemption notice: checkpoint saved at step 71", 75)
STOCKOUT = 'There is no more capacity in the zone "us-central2-b" (code 8)'
RESERVED = "Insufficient reserved capacity. Contact customer support to increase your reservation. (code 9)"
SPOT_TAKEN = "Cloud TPU received a bad request. update is not supported while in state PREEMPTED (code 3)"
QUOTA = "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 32 in zone us-central2-b."
BUDGET = {"restarts": 2, "max_restarts": 2}
WAIT = {"zone": "us-central2-b", "stockout_wait_s": 3600.0, "retry_s": 60.0}

# (name, facts, the decision's kind, words its reason must hold, a failure's retry)
SCENARIOS = [
    ("ready, nothing started", Facts(node="READY", now=NOW), "start", "no trainer", None),
    ("ready, trainer running", Facts(node="READY", now=NOW, job=JOB, verdict=RUNNING), "reattach", "step 40", None),
    (
        "ready, trainer done",
        Facts(node="READY", now=NOW, job=JOB, verdict=Verdict("done", "finished")),
        "done",
        "",
        None,
    ),
    ("node creating", Facts(node="CREATING", now=NOW), "wait", "CREATING", None),
    ("queued for capacity", Facts(node="QUEUED (WAITING_FOR_RESOURCES)", now=NOW), "wait", "QUEUED", None),
    ("no node yet", Facts(node=tpu.NOT_FOUND, now=NOW), "ensure_node", "NOT_FOUND", None),
    ("dead node, no trainer", Facts(node="PREEMPTED", now=NOW), "ensure_node", "PREEMPTED", None),
    ("preempted", Facts(node="PREEMPTED", now=NOW, job=JOB, verdict=RUNNING), "restart", "is PREEMPTED", None),
    (
        "trainer recorded failed, node PREEMPTED (issue 48)",
        Facts(node="PREEMPTED", now=NOW, job=JOB, verdict=FAILED, max_restarts=3),
        "restart",
        "TPU runtime went away",
        None,
    ),
    (
        "node gone under its trainer",
        Facts(node=tpu.NOT_FOUND, now=NOW, job=JOB, verdict=GONE, max_restarts=1),
        "restart",
        "NOT_FOUND (preempted?)",
        None,
    ),
    (
        "node replaced under its trainer",
        Facts(node="READY", now=NOW, job=JOB, replaced=True, max_restarts=1),
        "restart",
        "since replaced",
        None,
    ),
    (
        "a notice answered with a checkpoint, node READY",
        Facts(node="READY", now=NOW, job=JOB, verdict=NOTICE, max_restarts=1),
        "restart",
        "step 71",
        None,
    ),
    (
        "trainer lost on a READY node",
        Facts(node="READY", now=NOW, job=JOB, verdict=GONE),
        "wait",
        "asking it again",
        None,
    ),
    (
        "trainer lost on a READY node, asked again",
        Facts(node="READY", now=NOW, job=JOB, verdict=GONE, rechecked=True),
        "fail",
        "without an exit code",
        True,
    ),
    (
        "bad input, asked again",
        Facts(node="READY", now=NOW, job=JOB, verdict=BAD_INPUT, rechecked=True),
        "fail",
        "bad input",
        False,
    ),
    (
        "stalled, asked again",
        Facts(node="READY", now=NOW, job=JOB, verdict=STALLED, rechecked=True),
        "fail",
        "Watchdog",
        True,
    ),
    (
        "a retry finds an earlier try's trainer ended",
        Facts(node="READY", now=NOW, job=JOB, verdict=GONE, try_number=2),
        "start",
        "ended",
        None,
    ),
    (
        "a retry finds an earlier try's trainer stale",
        Facts(node="READY", now=NOW, job=JOB, verdict=STALLED, try_number=2),
        "start",
        "alive but stale",
        None,
    ),
    ("stockout", Facts(node="TERMINATED", now=NOW, node_error=STOCKOUT, **WAIT), "wait", "no more capacity", None),
    (
        "stockout past its wait",
        Facts(node="TERMINATED", now=NOW, node_error=STOCKOUT, stockout_until=NOW + 30, **WAIT),
        "fail",
        "no more capacity",
        True,
    ),
    (
        "no reserved capacity (code 9)",
        Facts(node=tpu.NOT_FOUND, now=NOW, node_error=RESERVED, **WAIT),
        "wait",
        "reserved",
        None,
    ),
    (
        "Spot preempted before READY (code 3)",
        Facts(node="PREEMPTED", now=NOW, node_error=SPOT_TAKEN, **WAIT),
        "ensure_node",
        "preempted before it was READY",
        None,
    ),
    (
        "quota refused",
        Facts(node=tpu.NOT_FOUND, now=NOW, node_error=QUOTA, **WAIT),
        "fail",
        "quota TPUV4sPodPerProjectPerZoneForTPUAPI in region us-central2",
        False,
    ),
    ("not READY in time", Facts(node="TIMEOUT", now=NOW, node_error="still CREATING"), "fail", "still CREATING", True),
    (
        "deadline",
        Facts(node="READY", now=NOW, deadline=NOW - 1, job=JOB, verdict=RUNNING),
        "fail",
        "deadline",
        False,
    ),
    (
        "restart budget spent",
        Facts(node="PREEMPTED", now=NOW, job=JOB, verdict=RUNNING, **BUDGET),
        "fail",
        "after train.max_restarts=2 restarts",
        True,
    ),
]
IDS = [name for name, *_ in SCENARIOS]


@pytest.mark.parametrize("name, facts, kind, words, retry", SCENARIOS, ids=IDS)
def test_the_decision(name, facts, kind, words, retry):
    action = decide(facts)
    assert (action.kind, action.retry if kind == "fail" else None) == (kind, retry), action
    assert words in action.why + action.advice, action


def test_capacity_answers_are_read_by_code_and_words():
    assert [capacity(e) for e in (STOCKOUT, RESERVED, SPOT_TAKEN, QUOTA, "boot disk failed (code 13)", None)] == [
        "stockout",
        "reserved",
        "preempted",
        "quota",
        None,
        None,
    ]
    # A 429 on the request-rate quota is a busy API (retried by the client), not a quota refusal.
    assert capacity("Quota exceeded for quota metric 'Requests' of service 'tpu.googleapis.com'.") is None


class _Seen(Exception):
    """The front end went on after its first decision (a deferral, a sleep, a start, a restart)."""


def _recorded(monkeypatch, module):
    decided = []

    def recording(facts):
        decided.append(decide(facts))
        return decided[-1]

    monkeypatch.setattr(module, "decide", recording)
    return decided


def _once(facts):
    given = iter([facts])

    def facts_once(*_, **__):
        try:
            return next(given)
        except StopIteration:
            raise _Seen() from None

    return facts_once


def _config(root):
    return {
        "compute": "tpu_vm",
        "output_root": root,
        "tpu": {"project": "proj", "zone": "us-central2-b", "poll_interval_s": 0.01},
    }


def _airflow(monkeypatch, root, facts):
    """The train task's answer to the first decision: done, a failure (retry or not), or it went on."""
    op = TrainOperator(task_id="train", config=_config(root), data={"fingerprint": "fp"})
    node = tpu.NodeState(name="mlm-n", state=facts.node, workers=(("10.0.0.2", ""),))
    first = _once(facts)
    monkeypatch.setattr(op, "_facts", lambda *a: (node, first()))
    monkeypatch.setattr(tpu_vm, "ensure_ready", lambda *a, **k: (_ for _ in ()).throw(_Seen()))
    monkeypatch.setattr(tpu_vm, "delete_left", lambda *a, **k: "operations/delete-1")
    monkeypatch.setattr(airflow_front, "use_connection", lambda conn_id: __import__("contextlib").nullcontext())
    monkeypatch.setattr(op, "_detached", lambda cfg: SimpleNamespace(start=lambda *a: JOB))
    monkeypatch.setattr(op, "_follow", lambda *a: (_ for _ in ()).throw(_Seen()))
    monkeypatch.setattr(op, "_watch", lambda cfg, job: SimpleNamespace(stop=lambda: None, tail_text=lambda: ""))
    context = {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": "r"}
    cfg = build_config({}, _config(root))
    try:
        op._drive(context, cfg)
        return "done"
    except (_Seen, TaskDeferred):
        return "went on"
    except AirflowFailException:
        return "fail, no retry"
    except AirflowException:
        return "fail, retry"


def _smoke(monkeypatch, root, facts):
    """The smoke command's answer to the first decision, as _airflow's."""
    cfg = build_config({}, _config(root))
    node = tpu.NodeState(name="mlm-n", state=facts.node, workers=(("10.0.0.2", ""),))
    driver = SmokeDriver(
        cfg,
        "r",
        "mlm-n",
        api=None,
        ensure=lambda: node,
        start_on=lambda ready: (JOB, None),
        out=lambda line: None,
    )
    driver.facts = _once(facts)
    driver.job = facts.job
    driver.watch = SimpleNamespace(stop=lambda: None, tail_text=lambda: "") if facts.job else None
    monkeypatch.setattr(
        smoke_front, "tpu", SimpleNamespace(get_state=lambda *a, **k: node, delete_node=lambda *a, **k: None)
    )
    monkeypatch.setattr(smoke_front, "time", SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=print))
    try:
        driver.run()
        return "done"
    except _Seen:
        return "went on"
    except TrainingFailed:
        return "fail"


@pytest.mark.parametrize("name, facts, kind, words, retry", SCENARIOS, ids=IDS)
def test_both_front_ends_take_the_table_s_decisions(monkeypatch, gcs_root, name, facts, kind, words, retry):
    decided_by_airflow = _recorded(monkeypatch, airflow_front)
    decided_by_smoke = _recorded(monkeypatch, smoke_front)
    airflow, smoke = _airflow(monkeypatch, gcs_root, facts), _smoke(monkeypatch, gcs_root, facts)
    assert decided_by_airflow[:1] == decided_by_smoke[:1] == [decide(facts)]
    expected = {"done": "done", "fail": "fail"}.get(kind, "went on")
    assert (airflow.split(",")[0], smoke) == (expected, expected)
    if kind == "fail":
        assert airflow == ("fail, retry" if retry else "fail, no retry")
