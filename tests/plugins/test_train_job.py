"""The train task's detached trainer on a TPU VM (plugins/mlm_airflow/operators/train.py,
plugins/mlm_airflow/triggers/train_job.py, the driver in mlm_tasks/job/launch.py and mlm_tasks/job/follow.py)
over a real sshd: the task starts it and defers; the trigger follows
it; it outlives the task's process and the trigger's; a retry reattaches to it (or stops a stale one); the
watchdog and on_kill stop it.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/plugins/test_train_job.py -q -s

The VM's python is a stand-in trainer (peers/stand_in_trainer.py): the real status record
(mlm_tasks/job/status.py, written to the GCS emulator, as on a VM to gs://) around a loop of sleeps
that records each step it makes and "checkpoints" every checkpoint_every steps, resuming from there.
The real trainer on the simulated TPU VM image: tests/plugins/test_simulated_tpu_vm.py. The task state
store is a file (peers/task_state.py), so that it survives a task runner the test SIGKILLs. The task
runs as Airflow runs a deferrable task, the trigger in this process (peers/deferral.py); the real
triggerer: tests/deploy/test_durable_train.py.
"""

import asyncio
import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow._shared.module_loading import import_string  # what the triggerer imports a classpath with
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from mlm_airflow.operators.train import JOB_KEY, TrainOperator
from mlm_tasks import storage
from mlm_tasks.job.restarts import read_restarts
from mlm_tasks.paths import RunPaths, join
from mlm_tasks.tpu import api as tpu
from peers.deferral import first_event, rebuilt, run_deferrable
from peers.sshd import airflow_conn_uri
from peers.stalled_peer import StalledPeer
from peers.stand_in_trainer import steps_made, write_stand_in
from peers.task_state import FileTaskState, start_train_task
from peers.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
ZONE = "us-central2-b"
RUN = "manual__detached"
NAME = tpu.node_name("mlm_pretrain", RUN)
DATA = {"fingerprint": "fp123"}


@pytest.fixture
def vm(request, tmp_path, sshd, gcs, fake_tpu, monkeypatch):
    """(config, workdir, store): a READY node whose worker 0 is the sshd, a stand-in trainer as its python
    (0.15 s a step, or the test's `@pytest.mark.parametrize("vm", [{"step_s": ...}], indirect=True)`;
    `bad_input_at_step` there too)."""
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))
    fake_tpu.add_node("proj", ZONE, NAME, state="READY")
    param = getattr(request, "param", {})
    python = write_stand_in(
        tmp_path, step_s=param.get("step_s", 0.15), bad_input_at_step=param.get("bad_input_at_step")
    )
    workdir = tmp_path / "vm"
    config = {
        "compute": "tpu_vm",
        "output_root": gcs.uri(f"detached-{tmp_path.name}"),
        "train": {
            "steps": 60,
            "checkpoint_every": 5,
            "heartbeat_s": 1,
            "stall_minutes": 0.25,  # 15 s: a loaded 2-core CI machine took over 6 s to start the stand-in
            "follow_poll_s": 0.2,
        },
        "tpu": {
            "project": "proj",
            "zone": ZONE,
            "api_endpoint": fake_tpu.url,
            "transport": "rest",
            "poll_interval_s": 0.05,
            "bootstrap": False,
            "ssh_port": sshd.port,
            "python": str(python),
            "workdir": str(workdir),
            "env": {"STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]},
        },
    }
    return SimpleNamespace(
        config=config,
        workdir=workdir,
        store=FileTaskState(tmp_path / "state.json"),
        run=RunPaths(config["output_root"], RUN),
    )


def _context(vm, try_number):
    return {
        "dag": SimpleNamespace(dag_id="mlm_pretrain"),
        "run_id": RUN,
        "ti": SimpleNamespace(try_number=try_number),
        "task_state_store": vm.store,
    }


def _train(vm, try_number, config=None):
    """One try of the train task, start to end, its trigger run in this process."""
    op = TrainOperator(task_id="train", config=config or vm.config, data=DATA)
    return run_deferrable(op, lambda: _context(vm, try_number), timeout=120)


def _status(vm):
    return storage.read_json_if_exists(vm.run.train_status)


def _steps(vm) -> list[tuple[int, int]]:
    """(pid, step) of each step the stand-in trainers made, in order."""
    return steps_made(vm.workdir, RUN)


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _first_try_killed(vm, tmp_path, at_step: int) -> dict:
    """Runs try 1's task runner in a subprocess and SIGKILLs it once the trainer passed `at_step`."""
    first = start_train_task(vm.config, RUN, vm.store.path, tmp_path / "first_try.log")
    try:
        wait_for(
            f"the first try's trainer to pass step {at_step}", lambda: (_status(vm) or {}).get("step", 0) >= at_step, 90
        )
    finally:
        first.kill()
        first.wait(timeout=10)
    job = vm.store.get(JOB_KEY)
    assert job and job["try_number"] == 1
    return job


@pytest.mark.parametrize("vm", [{"step_s": 0.4}], indirect=True)
def test_a_sigkilled_task_leaves_the_trainer_running_and_the_retry_reattaches(vm, tmp_path, capfd):
    """The retry must find the trainer still at work to log its progress: at 0.15 s a step the 50 steps left
    after the kill took 7.5 s, less than a loaded machine's retry needs to reattach and defer (a loop of 20
    runs failed once so, issue 28); at 0.4 s they take 20 s."""
    job = _first_try_killed(vm, tmp_path, at_step=10)
    killed_at = _status(vm)["step"]
    time.sleep(1)  # the trainer goes on without the task
    assert not _gone(job["pid"]) and _status(vm)["step"] > killed_at

    began = time.monotonic()
    assert _train(vm, 2) == {"node": NAME, "workers": 1}
    log = capfd.readouterr().out  # the task log (structlog -> stdout)
    [reattached] = re.findall(r"Reattached to the trainer of try 1 \(pid \d+\) in [0-9.]+s", log)
    assert "No second trainer is started" in log and "Starting the trainer" not in log
    assert re.search(r"Training: step \d+/60, loss [0-9.]+, 1000 tokens/s, ETA \dm\d\ds", log)  # progress

    status = _status(vm)
    assert (status["state"], status["exit_code"], status["step"], status["starts"], status["try_number"]) == (
        "done",
        0,
        60,
        1,
        1,
    )
    steps = _steps(vm)
    assert [s for _, s in steps] == list(range(1, 61)) and len({p for p, _ in steps}) == 1  # one trainer, no step twice
    lost = len(steps) - len({s for _, s in steps})
    print(
        f"\nreattach: {reattached.rsplit(' ', 1)[1]} to reattach (try 2 returned after "
        f"{time.monotonic() - began:.1f}s), steps lost {lost}, starts {status['starts']}"
    )


def test_a_frozen_trainer_fails_the_try_by_the_watchdog_and_the_retry_finishes(vm):
    """The race that hung CI (issue 28): SIGSTOP can freeze the stand-in while it holds a keep-alive connection
    to the GCS emulator. The emulator served one request at a time, so it sat reading that connection and
    every other client, the trigger's status read among them, queued behind it for ever; the trigger's
    thread blocked, and asyncio's shutdown with it. Fixed on both sides: the emulator serves each
    connection in its own thread (peers/gcs_emulator.py), and every storage call has a deadline
    (storage.timeout_s), so a silent peer fails a check instead of blocking it (the test below). The
    freeze can also land between a step and its checkpoint: the resume point is read, not assumed."""
    stall_s = vm.config["train"]["stall_minutes"] * 60
    frozen = {}

    def freeze():
        status = wait_for("the trainer to pass step 5", lambda: (s := _status(vm)) and s["step"] >= 5 and s)
        os.kill(status["pid"], signal.SIGSTOP)
        frozen.update(pid=status["pid"], at=time.monotonic())

    freezer = threading.Thread(target=freeze)
    freezer.start()
    with pytest.raises(AirflowException, match=r"Watchdog: no (heartbeat|new step) for \d+s") as err:
        _train(vm, 1)
    failed_after = time.monotonic() - frozen["at"]
    freezer.join()
    assert not isinstance(err.value, AirflowFailException)  # retried
    assert "stand-in trainer from step 0" in str(err.value)  # the log's last lines
    assert stall_s < failed_after < stall_s + 5, failed_after
    wait_for("the frozen trainer to be stopped", lambda: _gone(frozen["pid"]), 10)
    stopped_at = _steps(vm)[-1][1]
    # The stand-in's last checkpoint (every 5 steps): the freeze can land between a step and its
    # checkpoint, so the resume point is read, and held to within one checkpoint interval.
    resumed = (storage.read_json_if_exists(join(vm.run.root, "train", "ckpt.json")) or {"step": 0})["step"]
    assert stopped_at - 5 <= resumed <= stopped_at and resumed % 5 == 0, (resumed, stopped_at)

    _train(vm, 2)
    status = _status(vm)
    assert (status["state"], status["step"], status["starts"], status["try_number"]) == ("done", 60, 2, 2)
    steps = [s for _, s in _steps(vm)]
    assert steps == list(range(1, stopped_at + 1)) + list(range(resumed + 1, 61))
    print(
        f"\nwatchdog: failed the try {failed_after:.1f}s after the freeze (stall_minutes {stall_s:g}s); "
        f"steps lost {stopped_at - resumed}, starts {status['starts']}"
    )


def test_a_retry_stops_a_stale_trainer_it_finds_alive_then_starts_a_new_one(vm, tmp_path, capfd):
    job = _first_try_killed(vm, tmp_path, at_step=7)
    frozen = _status(vm)["pid"]
    os.kill(frozen, signal.SIGSTOP)  # alive, holding the lock, but beating no more
    stall_s = vm.config["train"]["stall_minutes"] * 60
    wait_for("its heartbeat to go stale", lambda: time.time() - _status(vm)["heartbeat"] > stall_s + 1, stall_s + 20)

    _train(vm, 2)
    assert "The stored trainer is alive but stale (no heartbeat for" in capfd.readouterr().out
    assert _gone(frozen) and _gone(job["pid"])
    status = _status(vm)
    assert (status["state"], status["step"], status["starts"]) == ("done", 60, 2)
    pids = [p for p, _ in _steps(vm)]
    assert len(set(pids)) == 2 and pids == sorted(pids, key=pids.index)  # one after the other, never both


def _deferred(vm, try_number=1, config=None):
    """The task's first half: start the trainer, then defer. Returns (the trigger it deferred to, seconds)."""
    began = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        TrainOperator(task_id="train", config=config or vm.config, data=DATA).execute(_context(vm, try_number))
    assert deferred.value.method_name == "trainer_ended"
    return deferred.value.trigger, time.monotonic() - began


def test_the_task_defers_once_the_trainer_runs_and_a_rebuilt_trigger_follows_on(vm):
    """The worker slot is held only for the start; the trigger, rebuilt as after a triggerer restart,
    follows the same trainer to its end: one start, no step twice."""
    trigger, held_s = _deferred(vm)
    job = vm.store.get(JOB_KEY)
    classpath = trigger.serialize()[0]
    assert classpath == "mlm_airflow.triggers.train_job.TrainJobTrigger" and trigger.job == job
    assert import_string(classpath) is type(trigger)  # as the triggerer imports it (plugins/ on its sys.path)

    async def follow_a_while_then_restart():
        first = asyncio.ensure_future(first_event(rebuilt(trigger)))
        passed = lambda: (_status(vm) or {}).get("step", 0) >= 20  # noqa: E731
        await asyncio.to_thread(wait_for, "the trainer to pass step 20", passed)
        first.cancel()  # the triggerer stops: the trigger is cancelled, on_kill is not called
        restarted = time.monotonic()
        event = await first_event(rebuilt(trigger))
        return event, restarted

    event, restarted = asyncio.run(asyncio.wait_for(follow_a_while_then_restart(), 120))
    assert event["kind"] == "done" and event["job"] == job
    op = TrainOperator(task_id="train", config=vm.config, data=DATA)
    began = time.monotonic()
    assert op.trainer_ended(_context(vm, 1), event) == {"node": NAME, "workers": 1}
    held_s += time.monotonic() - began
    status = _status(vm)
    assert (status["state"], status["step"], status["starts"]) == ("done", 60, 1)
    steps = _steps(vm)
    assert [s for _, s in steps] == list(range(1, 61)) and len({p for p, _ in steps}) == 1
    print(
        f"\ndeferred: the task held a slot {held_s:.1f}s of a {time.time() - job['started_at']:.1f}s "
        f"training; a rebuilt trigger followed on {time.monotonic() - restarted:.1f}s to the end, starts 1"
    )


def test_a_check_against_silent_storage_fails_within_its_deadline_and_leaves_no_thread(vm, monkeypatch, capfd):
    """The CI hang of issue 28: the trigger's check blocked for ever on a GCS read, and asyncio's shutdown
    waited on that thread. Against a storage peer that accepts and never answers, each check fails at
    storage.timeout_s' deadline and the trigger polls again; stopping it leaves no thread running."""
    from mlm_tasks.errors import TransientError

    trigger, _ = _deferred(vm, config={**vm.config, "storage": {"timeout_s": 0.5}})
    wait_for("the trainer to pass step 2", lambda: (_status(vm) or {}).get("step", 0) >= 2)
    follower = rebuilt(trigger)
    failed: list[tuple[BaseException, float]] = []  # each failed check, with the seconds it took
    check = follower._check

    def timed_check():
        began = time.monotonic()
        try:
            return check()
        except BaseException as err:
            failed.append((err, time.monotonic() - began))
            raise

    follower._check = timed_check

    async def follow_until_two_checks_failed():
        follow = asyncio.ensure_future(first_event(follower))
        deadline = time.monotonic() + 120
        while len(failed) < 2 and not follow.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        follow.cancel()  # the triggerer stops the trigger
        with contextlib.suppress(asyncio.CancelledError):
            await follow

    with StalledPeer() as peer:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", peer.endpoint)
        before = set(threading.enumerate())
        asyncio.run(follow_until_two_checks_failed())  # its close joins the loop's executor: a blocked check hangs it
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    log = "".join(capfd.readouterr())
    assert len(failed) >= 2, (failed, log[-3000:])
    for err, _took in failed:
        assert isinstance(err, TransientError) and "storage.timeout_s=0.5s" in str(err), err
    assert left == [], left
    assert log.count("Could not check the trainer") >= 2 and "Storage did not answer for gs://" in log
    # An SSH login and probe on a loaded machine, then the read given up at its deadline.
    assert max(took for _, took in failed) < storage.call_deadline() + 30, failed


def test_on_kill_stops_the_trainer(vm):
    """Marked failed while deferred: Airflow cancels the trigger and calls its on_kill."""
    trigger, _ = _deferred(vm)
    status = wait_for("the trainer to pass step 3", lambda: (s := _status(vm)) and s["step"] >= 3 and s)
    began = time.monotonic()
    asyncio.run(rebuilt(trigger).on_kill())
    assert _gone(status["pid"]) and _gone(vm.store.get(JOB_KEY)["pid"])
    assert _status(vm)["state"] == "running"  # killed: no end recorded
    print(f"\non_kill: the trainer was gone {time.monotonic() - began:.2f}s after the trigger's on_kill")


def test_on_kill_before_the_deferral_stops_the_trainer(vm):
    """Killed between the start and the deferral (the task runner's on_kill): the same stop."""
    op = TrainOperator(task_id="train", config=vm.config, data=DATA)
    with pytest.raises(TaskDeferred):
        op.execute(_context(vm, 1))
    wait_for("the trainer to pass step 2", lambda: (_status(vm) or {}).get("step", 0) >= 2)
    op.on_kill()
    assert _gone(vm.store.get(JOB_KEY)["pid"])


@pytest.mark.parametrize("vm", [{"bad_input_at_step": 4}], indirect=True)
def test_a_trainer_that_exits_2_fails_without_retry_with_its_last_lines(vm):
    with pytest.raises(AirflowFailException) as err:
        _train(vm, 1)
    message = str(err.value)
    assert "failed: NoRetryError: bad input at step 4" in message and "no retry can fix" in message
    assert "error: the shards are not what this run was planned on" in message  # from the trainer's log
    assert _status(vm)["exit_code"] == 2


@pytest.mark.parametrize("vm", [{"step_s": 0.1}], indirect=True)
def test_node_losses_and_trigger_timeouts_are_handled_inside_one_try(vm, fake_tpu):
    """Issue 31: a preempted node (its processes killed, its state PREEMPTED) is replaced and the
    training restarted from its last checkpoint inside try 1, twice, and the trigger's timeout
    (train.check_in_minutes, 3 s here) is a check-in that reattaches, not a failure. One more loss than
    train.max_restarts fails the try (the next test)."""
    config = {**vm.config, "train": {**vm.config["train"], "steps": 150, "check_in_minutes": 0.05, "max_restarts": 2}}
    lost: list[int] = []

    def preempt(at_step: int, starts: int) -> None:
        status = wait_for(
            f"trainer {starts} past step {at_step}",
            lambda: (s := _status(vm)) and s["starts"] == starts and s["step"] >= at_step and s,
            90,
        )
        fake_tpu.preempt(NAME)
        os.killpg(os.getpgid(status["pid"]), signal.SIGKILL)  # a preempted VM's processes go with it
        lost.append(status["pid"])

    preempter = threading.Thread(target=lambda: (preempt(22, 1), preempt(73, 2)), daemon=True)
    preempter.start()
    _train(vm, 1, config)
    preempter.join(timeout=5)

    status = _status(vm)
    assert (status["state"], status["step"], status["starts"], status["try_number"]) == ("done", 150, 3, 1), status
    restarts = read_restarts(vm.run)
    assert status["restarts"] == restarts  # the last trainer's copy in the status record
    assert len(restarts) == 2 and all("PREEMPTED" in r["cause"] and r["try_number"] == 1 for r in restarts), restarts
    # Found by the trigger (the node is PREEMPTED) or by a check-in that replaced it first: the cause names
    # the preemption either way (CI saw the second path).
    # Every step once, but those after each loss's last checkpoint, which the next trainer makes again.
    expected = list(range(1, restarts[0]["step"] + 1))
    expected += list(range(restarts[0]["resumed_from"] + 1, restarts[1]["step"] + 1))
    expected += list(range(restarts[1]["resumed_from"] + 1, 151))
    made = _steps(vm)
    assert [s for _, s in made] == expected
    for r in restarts:
        assert r["resumed_from"] % 5 == 0 and r["steps_lost"] == r["step"] - r["resumed_from"] < 5, r
    assert len({p for p, _ in made}) == 3 and lost == [p for p in dict.fromkeys(p for p, _ in made)][:2]
    assert vm.store.get("train_restarts") == 2
    assert vm.store.get("train_check_ins") >= 2, "the run outlasted two check-ins of 3 s"
    print(f"\nrestarts in one try: {restarts}; check-ins {vm.store.get('train_check_ins')}")


@pytest.mark.parametrize("vm", [{"step_s": 0.1}], indirect=True)
def test_a_node_preempted_under_a_live_trainer_is_a_restart_at_the_check_in(vm, fake_tpu):
    """The API says PREEMPTED while SSH still answers (a preemption's notice period): the trigger, which asks
    the node's state only when SSH is silent, follows on, and the check-in finds the node not READY and
    replaces it; its processes go with the delete. The stored trainer is a restart, counted and recorded,
    though the new node has the old one's name and address (found in CI: it was read as a trainer that had
    ended, a new one started and the loss was in no record)."""
    config = {**vm.config, "train": {**vm.config["train"], "steps": 80, "check_in_minutes": 0.05, "max_restarts": 1}}
    killed: list[int] = []

    def preempt_then_kill_at_the_delete() -> None:
        status = wait_for("the trainer past step 12", lambda: (s := _status(vm)) and s["step"] >= 12 and s, 90)
        created = fake_tpu.node("proj", ZONE, NAME)["createTime"]
        fake_tpu.preempt(NAME)
        wait_for(
            "the check-in deleting the node",
            lambda: (
                (n := fake_tpu.node("proj", ZONE, NAME)) is None
                or (n["state"], n["createTime"]) != ("PREEMPTED", created)
            ),
            60,
            poll_s=0.02,
        )
        os.killpg(os.getpgid(status["pid"]), signal.SIGKILL)
        killed.append(status["pid"])

    preempter = threading.Thread(target=preempt_then_kill_at_the_delete, daemon=True)
    preempter.start()
    _train(vm, 1, config)
    preempter.join(timeout=5)

    status = _status(vm)
    assert (status["state"], status["step"], status["starts"], status["try_number"]) == ("done", 80, 2, 1), status
    (restart,) = read_restarts(vm.run)
    # Found at the check-in (the new node's createTime differs: the cause says it was replaced); on a loaded
    # machine the trigger's SSH probe may time out first and find the node PREEMPTED: one restart either way,
    # counted and recorded, and its cause names the loss.
    assert "which was replaced by " + NAME in restart["cause"] or "is PREEMPTED" in restart["cause"], restart
    assert restart["try_number"] == 1 and restart["resumed_from"] % 5 == 0, restart
    made = _steps(vm)
    old = [step for pid, step in made if pid == made[0][0]]
    new = [step for pid, step in made if pid != made[0][0]]
    # The old trainer ran until the delete took it (a kill may land between a step and its record), the new
    # one from the last checkpoint before that.
    assert old == list(range(1, len(old) + 1)) and 0 <= len(old) - restart["resumed_from"] <= 5, (old, restart)
    assert new == list(range(restart["resumed_from"] + 1, 81)), (new, restart)
    assert killed == [made[0][0]] and vm.store.get("train_restarts") == 1
    print(f"\nthe restart's cause: {restart['cause']}")


@pytest.mark.parametrize("vm", [{"step_s": 0.1}], indirect=True)
def test_a_loss_past_max_restarts_fails_the_try_and_the_deadline_fails_the_run(vm, fake_tpu):
    config = {**vm.config, "train": {**vm.config["train"], "steps": 400, "max_restarts": 0}}

    def preempt() -> None:
        status = wait_for("the trainer past step 3", lambda: (s := _status(vm)) and s["step"] >= 3 and s, 90)
        fake_tpu.preempt(NAME)
        os.killpg(os.getpgid(status["pid"]), signal.SIGKILL)

    threading.Thread(target=preempt, daemon=True).start()
    with pytest.raises(AirflowException, match=r"lost its node again .* after train.max_restarts=0 restarts") as err:
        _train(vm, 1, config)
    assert not isinstance(err.value, AirflowFailException)  # an Airflow retry goes on

    # Try 2 keeps try 1's deadline (the task state store): a run over train.timeout_hours is stopped at a
    # check-in and fails without retry, whatever try it is in.
    vm.store.set("train_deadline", time.time() + 4)
    config["train"]["check_in_minutes"] = 0.02
    with pytest.raises(AirflowFailException, match=r"reached its deadline, train.timeout_hours=") as err:
        _train(vm, 2, config)
    pid = _status(vm)["pid"]
    wait_for("the trainer stopped at the deadline", lambda: _gone(pid), 10)
    assert _status(vm)["step"] < 400


@pytest.mark.parametrize("vm", [{"step_s": 0.1}], indirect=True)
def test_a_trainer_that_records_failed_as_its_node_is_preempted_is_a_restart_in_one_try(vm, fake_tpu):
    """Issue 48: the TPU runtime erroring as its host goes down is recorded "failed" (exit 1); the node's word
    comes first, so a node PREEMPTED under it is a restart inside the try, the trainer's words in the cause."""
    from mlm_tasks.paths import safe_run_id

    config = {**vm.config, "train": {**vm.config["train"], "steps": 40, "max_restarts": 1}}

    def preempt() -> None:
        wait_for("the trainer past step 5", lambda: (s := _status(vm)) and s["step"] >= 5, 90)
        fake_tpu.preempt(NAME)
        (vm.workdir / f"fail-{safe_run_id(RUN)}").write_text("")

    threading.Thread(target=preempt, daemon=True).start()
    assert _train(vm, 1, config) == {"node": NAME, "workers": 1}
    (restart,) = read_restarts(vm.run)
    assert restart["try_number"] == 1 and "is PREEMPTED" in restart["cause"], restart
    assert "RuntimeError: TPU runtime: the host is going down" in restart["cause"], restart
    status = _status(vm)
    assert (status["state"], status["step"], status["starts"]) == ("done", 40, 2)
    assert vm.store.get("train_restarts") == 1


@pytest.mark.parametrize("vm", [{"step_s": 0.05}], indirect=True)
def test_a_clear_starts_a_new_deadline_and_restart_budget_a_retry_does_not(vm):
    """Issue 48: the deadline and the restart count live in the task state store, which a Clear does not
    touch. Airflow's clear_task_instances sets max_tries to the last try plus retries, so the try sequence's
    first try (max_tries - retries + 1) moves on a Clear and not on a retry."""
    config = {**vm.config, "train": {**vm.config["train"], "steps": 20}}

    def context(try_number, max_tries):
        ti = SimpleNamespace(try_number=try_number, max_tries=max_tries)
        return {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": RUN, "ti": ti, "task_state_store": vm.store}

    def train(try_number, max_tries):
        op = TrainOperator(task_id="train", config=config, data=DATA, retries=2)
        return run_deferrable(op, lambda: context(try_number, max_tries), timeout=120)

    # Tries 1-2 of the first sequence (max_tries = retries = 2): its deadline passed, its restarts spent.
    vm.store.set("train_first_try", 1)
    vm.store.set("train_deadline", time.time() - 60)
    vm.store.set("train_restarts", 10)
    with pytest.raises(AirflowFailException, match="reached its deadline"):
        train(2, 2)  # a retry: the same deadline
    assert vm.store.get("train_restarts") == 10
    assert train(3, 4) == {"node": NAME, "workers": 1}  # cleared after try 2: max_tries = 2 + retries
    assert vm.store.get("train_first_try") == 3 and vm.store.get("train_restarts", 0) == 0
    assert vm.store.get("train_deadline") > time.time()
    assert (_status(vm)["state"], _status(vm)["step"]) == ("done", 20)
