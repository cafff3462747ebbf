"""Durable training (issue 20) on the real stack: mlm_pretrain with `compute: tpu_vm` under the
CeleryExecutor, the train task deferred to its trigger on the triggerer while the trainer runs
detached on the "TPU VM", driven through the REST API.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/deploy/test_durable_train.py -s   # -s: figures

The stack (tests/peers/airflow_stack.py): PostgreSQL, redis-server, api-server, scheduler,
dag-processor, triggerer and ONE Celery worker with ONE task slot, consuming both queues. The TPU VM
is the fake TPU API (its nodes publish the sshd's host key) in front of the sshd peer, whose python
is a stand-in trainer (peers/stand_in_trainer.py: the real status record, ~0.25 s a step, each step
logged with its pid) that ends with a model the real train step made on the same data, so evaluate,
fill_mask and report run for real. Everything the VM needs is a deployment setting, so it comes from a
deployment file written here (MLM_DEPLOYMENT), as in production; a run's conf sets only run settings.

output_root is a gs:// prefix of the GCS emulator (compute: tpu_vm requires gs://; TensorFlow's
gs:// in evaluate goes through the TLS proxy, peers/tls_proxy.py), the same for every run. Cheap
upstream: the real steps write its shard set and the reference model in a subprocess while the stack
starts; every run's plan_shards finds the set complete and write_shards is skipped. Test-only timing:
a killed triggerer's triggers move to a live one after 10 s (`triggerer_health_check_threshold`,
production default 30 s; heartbeat 2 s, default 5 s); timed-out triggers are looked for every 3 s (default 15 s).
Figures are printed (`[durable figure] ...`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from mlm_tasks import storage
from mlm_tasks.job.restarts import read_restarts
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.tpu import api as tpu
from peers.airflow_rest import AirflowApi
from peers.airflow_stack import ROOT, running_stack
from peers.fake_tpu_api import FakeTpuApi
from peers.figures import Figures
from peers.sshd import airflow_conn_uri, host_public_key
from peers.stand_in_trainer import set_pace, steps_made, write_stand_in
from peers.tiny_data import TINY_FORM
from peers.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DAG_ID, JANITOR = "mlm_pretrain", "mlm_tpu_janitor"
PROJECT, ZONE = "mlm-test-project", "us-central2-b"
WORKER = "worker-a"
STEP_S = 0.25
REFERENCE = "reference"  # the run id of the model the real train step makes for the stand-in to hand on
RUN_TIMEOUT_S = 300
TIMING = {
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
    "MLM_RETRY_DELAY_S": "5",
    "MLM_REFRESH_SCHEDULE": "none",
    "MLM_TPU_RETRY_INITIAL_S": "0.05",
    # The scheduler looks for timed-out triggers every 3 s (default 15): a run's check-ins
    # (train.check_in_minutes) then come within seconds of their timeout.
    "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "3",
}
# Run settings of every run: tight follow and watchdog timings (a stalled trainer fails a try after 1 min).
FOLLOW = {
    "train.checkpoint_every": 10,
    "train.heartbeat_s": 1,
    "train.stall_minutes": 1,
    "train.follow_poll_s": 0.5,
    "tpu.poll_interval_s": 0.2,
    "tpu.zone": ZONE,
}
PROGRESS = "Training: step "
# The shard set and the reference model, by the real steps (the DAG's plan_shards then finds the set).
PREPARE = f"""import sys
from mlm_tasks.paths import RunContext
from mlm_tasks.steps import build_shard_set
from mlm_tasks.steps.train import train
from peers.tiny_data import tiny_config
cfg = tiny_config(sys.argv[1])
data = build_shard_set(cfg)
train(cfg, RunContext.of(cfg, {REFERENCE!r}, data["fingerprint"]))
print("fingerprint", data["fingerprint"])
"""

figure = Figures("durable")  # printed as they come, and all at the end (-s shows them)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """This machine's folder for the VM's workdir, the stand-in trainer and the TPU registry."""
    return tmp_path_factory.mktemp("durable")


@pytest.fixture(scope="module")
def output_root(gcs) -> str:
    return gcs.uri(f"durable-{time.time_ns()}")


@pytest.fixture(scope="module")
def preparing(output_root, tf_gcs_env):
    """The subprocess writing the shard set and the reference model (started before the stack)."""
    env = {**os.environ, **tf_gcs_env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", PREPARE, output_root],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tpu_api(oauth_server, sshd):
    with FakeTpuApi(oauth=oauth_server) as api:
        api.host_keys = dict([host_public_key(sshd)])
        yield api


@pytest.fixture(scope="module")
def workdir(shared) -> Path:
    """tpu.workdir: the trainers' logs and steps-<run>.log; a trainer a failed test left running is
    killed at the end (the sshd started it: it is no process of the stack's)."""
    path = shared / "vm"
    yield path
    for log in path.glob("steps-*.log"):
        for pid in {int(line.split()[0]) for line in log.read_text().splitlines()}:
            with contextlib.suppress(OSError):  # by pid, and only if it still is a stand-in (no reused pid)
                if not gone(pid) and b"stand_in_trainer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def deployment(shared, output_root, workdir, tpu_api, sshd, gcs, tf_gcs_env) -> Path:
    """The deployment file: everything about the VM (endpoint, port, python, workdir) is set here only."""
    python = write_stand_in(shared, STEP_S, model_from=REFERENCE)
    tpu = {
        "project": PROJECT,
        "api_endpoint": tpu_api.url,
        "transport": "rest",
        "ssh_conn_id": "tpu_ssh",
        "ssh_port": sshd.port,
        "python": str(python),
        "workdir": str(workdir),
        "bootstrap": False,
        "env": {"STORAGE_EMULATOR_HOST": gcs.endpoint, "HF_HUB_OFFLINE": "1", **tf_gcs_env},
    }  # the VM's gs:// is the emulator, TensorFlow's too (evaluate, downstream and fill_mask run on the VM)
    path = shared / "deployment.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "settings": {"gcp_conn_id": "google_cloud_default", "tpu": tpu},
                "output_roots": [output_root],
                "config_dirs": [str(ROOT / "configs")],
                "zones": [ZONE],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared, deployment, preparing, sshd, sa_key, tf_gcs_env):
    registry = shared / "tpu-registry"
    registry.mkdir()
    env = {
        **TIMING,
        **tf_gcs_env,
        "MLM_DEPLOYMENT": str(deployment),
        "MLM_TPU_REGISTRY": str(registry),
        "MLM_TPU_ZONES": ZONE,
        "AIRFLOW_CONN_TPU_SSH": airflow_conn_uri(sshd, no_host_key_check=False),  # pins the published host key
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(sa_key)}}
        ),
    }
    t0 = time.monotonic()
    with running_stack(tmp_path_factory.mktemp("durable-stack"), executor="CeleryExecutor", extra_env=env) as stack:
        stack.start_worker(WORKER, "cpu,control", concurrency=1)
        figure("stack start (PostgreSQL, Redis, 4 services, 1 worker of 1 slot) s", round(time.monotonic() - t0, 1))
        yield stack
    figure.dump()


@pytest.fixture(scope="module")
def api(stack, preparing) -> AirflowApi:
    api = AirflowApi(stack.url, stack.token)
    assert not api.get("/importErrors")["import_errors"]
    for dag_id in (DAG_ID, JANITOR):  # the janitor's hourly run starts now, not in the middle of a test
        assert api.unpause(dag_id)["is_paused"] is False
    out, _ = preparing.communicate(timeout=300)
    assert preparing.returncode == 0, out[-4000:]
    return api


def trigger(api: AirflowApi, run_id: str, output_root: str, steps: int, overrides: dict | None = None) -> str:
    conf = {
        **TINY_FORM,
        "output_root": output_root,
        "compute": "tpu_vm",
        "steps": steps,
        "overrides": {**FOLLOW, **(overrides or {})},
    }
    assert api.trigger(DAG_ID, conf=conf, run_id=run_id)["state"] == "queued"
    return run_id


def finished(api: AirflowApi, run_id: str, want: str = "success") -> dict:
    done = api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S, poll=1)
    assert done["state"] == want, f"{run_id} ended {done['state']}:\n" + api.explain(DAG_ID, run_id)
    return done


def status(output_root: str, run_id: str) -> dict:
    return read_status(RunPaths(output_root, run_id)) or {}


class TrainWatch(threading.Thread):
    """Polls the train task instance's state (every 0.2 s, its own client): the intervals it spent in
    each state, as [(state, since, until)] in wall-clock seconds."""

    def __init__(self, stack, run_id: str):
        super().__init__(daemon=True)
        self.api, self.run_id = AirflowApi(stack.url, stack.token), run_id
        self.spans: list[list] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                state = self.api.task_instance(DAG_ID, self.run_id, "train")["state"]
            except AssertionError:  # not created yet
                state = None
            now = time.time()
            if self.spans and self.spans[-1][0] == state:
                self.spans[-1][2] = now
            else:
                self.spans.append([state, now, now])
            time.sleep(0.2)

    @property
    def state(self) -> str | None:
        return self.spans[-1][0] if self.spans else None

    def seconds_in(self, state: str) -> float:
        return sum(until - since for s, since, until in self.spans if s == state)

    def __enter__(self) -> TrainWatch:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join(timeout=10)


def deferred_and_past(api: AirflowApi, watch: TrainWatch, output_root: str, run_id: str, step: int) -> dict:
    """The status record once train is deferred and its trainer has passed `step`."""

    def ready():
        record = status(output_root, run_id)
        return watch.state == "deferred" and record.get("step", 0) >= step and record

    try:
        return wait_for(f"train of {run_id} deferred with its trainer past step {step}", ready, 240, poll_s=0.2)
    except AssertionError as err:
        raise AssertionError(f"{err}; train: {watch.state}\n" + api.explain(DAG_ID, run_id)) from None


def progress_lines(api: AirflowApi, run_id: str) -> int:
    """Progress lines in train's try 1 log so far (the trigger's, while deferred)."""
    return api.log(DAG_ID, run_id, "train", 1).count(PROGRESS)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_scheduler_restart_and_triggerer_sigkill_mid_training_lose_no_step(api, stack, output_root, workdir):
    run_id = "durable-restarts"
    steps = 120
    with TrainWatch(stack, trigger(api, run_id, output_root, steps)) as watch:
        deferred_and_past(api, watch, output_root, run_id, 3)
        # 2 s a step until the new triggerer has reattached: the trainer runs on while the services are down,
        # and cannot finish before they are back however long a loaded machine takes to restart them (at
        # 0.25 s a step, 120 steps were over before a restarted triggerer logged on a loaded 2-core machine).
        set_pace(workdir, run_id, 2.0)
        stack.stop("airflow-scheduler")  # SIGTERM, as `docker compose restart` does
        stack.restart("airflow-scheduler")
        stack.kill("airflow-triggerer")  # SIGKILL: its trigger dies with it, no cleanup
        killed_at_step = status(output_root, run_id)["step"]
        seen = progress_lines(api, run_id)
        restarted_at = time.monotonic()
        stack.restart("airflow-triggerer")
        wait_for("a progress line of the restarted triggerer", lambda: progress_lines(api, run_id) > seen, 120, 0.5)
        reattach_s = time.monotonic() - restarted_at
        reattached_at_step = status(output_root, run_id)["step"]
        set_pace(workdir, run_id, None)
        finished(api, run_id)

    record = status(output_root, run_id)
    assert (record["state"], record["step"], record["starts"], record["try_number"]) == ("done", steps, 1, 1), record
    made = steps_made(workdir, run_id)
    assert [s for _, s in made] == list(range(1, steps + 1)), "a step was repeated or skipped"
    assert len({p for p, _ in made}) == 1, "more than one trainer ran"
    tis = {ti["task_id"]: ti for ti in api.task_instances(DAG_ID, run_id)}
    assert tis["train"]["try_number"] == 1
    assert tis["write_shards"]["state"] == "skipped"  # the prepared shard set: no shard written in this module
    assert killed_at_step < reattached_at_step < steps, (
        f"the trainer did not run on while the triggerer was down: step {killed_at_step} when it was killed, "
        f"{reattached_at_step} when the new one logged, of {steps}"
    )
    figure("scheduler restart + triggerer SIGKILL: restart to the next progress line s", round(reattach_s, 1))
    figure(
        "... trainer steps made meanwhile / steps lost / starts",
        (reattached_at_step - killed_at_step, len(made) - len({s for _, s in made}), record["starts"]),
    )


def test_train_holds_no_worker_slot_while_it_trains(api, stack, output_root):
    run_id = "durable-slot"
    with TrainWatch(stack, trigger(api, run_id, output_root, 80)) as watch:
        deferred_and_past(api, watch, output_root, run_id, 3)
        janitor = api.trigger(JANITOR, conf={"zones": [ZONE]}, run_id="janitor-during-train")["dag_run_id"]
        done = api.wait_for_run(JANITOR, janitor, timeout=120, poll=0.5)
        assert done["state"] == "success", api.explain(JANITOR, janitor)
        trained = status(output_root, run_id)
        wait_for("train to succeed", lambda: watch.state == "success", RUN_TIMEOUT_S, 0.5)

    # The janitor's tasks ran on the one slot of the one worker, while train was deferred there.
    deferred = [(since, until) for s, since, until in watch.spans if s == "deferred"]
    for ti in api.task_instances(JANITOR, janitor):
        assert ti["state"] == "success" and ti["hostname"] == WORKER, ti
        assert any(since < epoch(ti["start_date"]) and epoch(ti["end_date"]) < until for since, until in deferred), (
            ti["task_id"],
            ti["start_date"],
            ti["end_date"],
            watch.spans,
        )
    assert trained["state"] == "running", "training ended before the janitor had run"
    assert api.task_instance(DAG_ID, run_id, "train")["hostname"] == WORKER
    held, waited = watch.seconds_in("running"), watch.seconds_in("deferred")
    assert held < waited / 2, watch.spans
    figure(
        "slot-seconds train held (start + resume) / seconds deferred while training", (round(held, 1), round(waited, 1))
    )


def test_marking_train_failed_stops_the_trainer_and_the_teardown_deletes_the_vm(
    api, stack, output_root, workdir, tpu_api
):
    run_id = "durable-mark-failed"
    with TrainWatch(stack, trigger(api, run_id, output_root, 400)) as watch:
        pid = deferred_and_past(api, watch, output_root, run_id, 3)["pid"]
        node = f"projects/{PROJECT}/locations/{ZONE}/nodes/{tpu.node_name(DAG_ID, run_id)}"
        assert node in tpu_api.nodes
        # The triggerer runs the trigger (its first progress line is in the log): only a running trigger
        # has an on_kill. One marked failed before the triggerer picked it up ends with the VM's delete.
        wait_for("the trigger's first progress line", lambda: progress_lines(api, run_id) >= 1, 60, 0.5)
        marked_at = time.monotonic()
        reply = api.client.patch(
            f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/train", json={"new_state": "failed"}
        )
        assert reply.status_code == 200, reply.text
        wait_for(f"the trainer (pid {pid}) to stop", lambda: gone(pid), 60, 0.2)  # within a minute
        stopped_s = time.monotonic() - marked_at
        finished(api, run_id, want="failed")

    teardown = api.task_instance(DAG_ID, run_id, "delete_tpu_vm")
    assert teardown["state"] == "success", api.explain(DAG_ID, run_id)
    assert node not in tpu_api.nodes, "the teardown left the node"
    assert any(method == "DELETE" and path.endswith(node) for method, path in tpu_api.requests)
    made = [s for _, s in steps_made(workdir, run_id)]
    assert made and made[-1] < 400
    figure("train marked failed (REST): trainer gone after s", round(stopped_s, 1))


def test_two_preemptions_two_check_ins_and_a_stockout_in_one_try(api, stack, output_root, workdir, tpu_api):
    """Issue 31 on the real stack: the node is preempted twice (its state PREEMPTED, its processes killed)
    and the first replacement meets a stockout; the trigger's timeout (train.check_in_minutes, 6 s) passes
    again and again. All of it inside try 1 of train (and of create_tpu_vm): the run completes, every step
    is made once but those after each loss's last checkpoint, and the status record and the report say what
    happened."""
    run_id, steps = "durable-week", 160
    node = tpu.node_name(DAG_ID, run_id)
    lost: list[int] = []

    def preempt(at_step: int, starts: int, stockout: bool = False) -> None:
        record = wait_for(
            f"trainer {starts} past step {at_step}",
            lambda: (
                (s := status(output_root, run_id)) and s.get("starts") == starts and s.get("step", 0) >= at_step and s
            ),
            240,
            poll_s=0.2,
        )
        if stockout:  # the replacement's first create finds no capacity
            tpu_api.fail_next_create("There is no more capacity in the zone")
        tpu_api.preempt(node)
        os.killpg(os.getpgid(record["pid"]), signal.SIGKILL)  # a preempted VM's processes go with it
        lost.append(record["pid"])

    preempter = threading.Thread(target=lambda: (preempt(22, 1, stockout=True), preempt(73, 2)), daemon=True)
    overrides = {"train.check_in_minutes": 0.1}
    t0, seen = time.monotonic(), len(tpu_api.requests)
    trigger(api, run_id, output_root, steps, overrides)
    preempter.start()
    finished(api, run_id)
    preempter.join(timeout=10)
    assert len(lost) == 2, "the trainer never reached the second preemption"

    record = status(output_root, run_id)
    assert (record["state"], record["step"], record["starts"], record["try_number"]) == ("done", steps, 3, 1), record
    restarts = read_restarts(RunPaths(output_root, run_id))
    assert record["restarts"] == restarts  # the last trainer's copy in the status record
    assert len(restarts) == 2 and all("PREEMPTED" in r["cause"] and r["try_number"] == 1 for r in restarts), restarts
    expected = list(range(1, restarts[0]["step"] + 1))
    expected += list(range(restarts[0]["resumed_from"] + 1, restarts[1]["step"] + 1))
    expected += list(range(restarts[1]["resumed_from"] + 1, steps + 1))
    assert [s for _, s in steps_made(workdir, run_id)] == expected  # nothing made twice but the lost steps
    assert all(r["steps_lost"] == r["step"] - r["resumed_from"] < 10 for r in restarts), restarts

    tis = {ti["task_id"]: ti for ti in api.task_instances(DAG_ID, run_id)}
    assert tis["train"]["try_number"] == tis["create_tpu_vm"]["try_number"] == 1
    log = api.log(DAG_ID, run_id, "train", 1)
    assert log.count("the trainer's trigger reached train.check_in_minutes") >= 2, "fewer than two check-ins"
    assert "No capacity for v4-8 in us-central2-b" in log and "in this try" in log
    # create; preempted: delete, create (no capacity); its delete, create; preempted: delete, create; teardown
    writes = [
        m
        for m, path in tpu_api.requests[seen:]
        if (m, path.rsplit("/", 1)[-1]) in (("POST", "nodes"), ("DELETE", node))
    ]
    assert writes == ["POST", "DELETE"] * 4, writes
    report = storage.read_text(RunPaths(output_root, run_id).report + "/report.md")
    assert "- Restarts in try 1: 2" in report and report.count("PREEMPTED") >= 2, report
    figure(
        "2 preemptions + a stockout in one try: run s / check-ins",
        (round(time.monotonic() - t0, 1), log.count("the trainer's trigger reached train.check_in_minutes")),
    )
