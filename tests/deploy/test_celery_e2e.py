"""The CeleryExecutor deployment on real processes: PostgreSQL, redis-server, api-server, scheduler,
dag-processor, triggerer and two Celery workers (one task slot each), driven through the REST API.

    .venv/bin/python -m pytest tests/deploy/test_celery_e2e.py -s     # -s prints the figures

`worker-a` consumes both queues (`cpu,control`), `worker-b` only `cpu`, so the control tasks can only
run on worker-a while the four mapped `write_shards` tasks of `mlm_dataset_refresh`
(`shards.partitions: 4`) spread over both. One stack serves the module (starting it is most of the
time); each test triggers its own run into its own output_root under a folder declared shared
(MLM_SHARED_OUTPUT_ROOTS), and the fault tests leave the stack as they found it.

The fault runs reuse the tokenizer of the undisturbed run (Unigram training is not id-reproducible),
so their shard sets must come out byte-identical to it. Assertions read the manifest and the files it
lists, never hard-coded shard names. Figures (time to recover, tasks retried) are printed and kept
in bench/RESULTS.md ("CeleryExecutor").
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from mlm_tasks.steps import SHARD_SET_STEPS
from peers.airflow_rest import AirflowApi
from peers.airflow_stack import ROOT, data_volume, running_stack
from peers.figures import Figures
from peers.file_watch import FolderWatch, sha256

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = "mlm_dataset_refresh"
WORKERS = {"worker-a": "cpu,control", "worker-b": "cpu"}
CPU_TASKS = set(SHARD_SET_STEPS)
PARTS = 4
RUN_TIMEOUT_S = 600
# Enough text that a partition takes a few seconds to write, so a fault can land in the middle of one.
DATA = {"shards.partitions": PARTS, "corpus.max_articles": 60}
# Test-only timing: a lost worker's task is declared dead after 20 s (production default: 300 s).
# Retries keep the production shape (doubling), starting at 10 s so 2 retries outlast a 20 s outage.
TIMING = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "MLM_RETRY_DELAY_S": "10",
    "MLM_REFRESH_SCHEDULE": "none",
}

figure = Figures("celery")  # printed as they come, and all at the end (-s shows them)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared):
    t0 = time.monotonic()
    with running_stack(
        tmp_path_factory.mktemp("celery-stack"),
        executor="CeleryExecutor",
        extra_env={**TIMING, "MLM_SHARED_OUTPUT_ROOTS": str(shared)},
    ) as stack:
        for name, queues in WORKERS.items():
            stack.start_worker(name, queues)
        figure("stack start (PostgreSQL, Redis, 4 services, 2 workers) s", round(time.monotonic() - t0, 1))
        yield stack
    figure.dump()


@pytest.fixture(scope="module")
def api(stack) -> AirflowApi:
    api = AirflowApi(stack.url, stack.token)
    assert not api.get("/importErrors")["import_errors"]
    assert api.unpause(DAG_ID)["is_paused"] is False
    return api


def conf(output_root: Path) -> dict:
    return {
        "config_file": str(ROOT / "configs" / "tiny.yaml"),
        "output_root": str(output_root),
        "overrides": dict(DATA),
    }


def trigger(api: AirflowApi, run_id: str, output_root: Path) -> str:
    run = api.trigger(DAG_ID, conf=conf(output_root), run_id=run_id)
    assert run["state"] == "queued", run
    return run_id


def finished(api: AirflowApi, run_id: str) -> dict:
    done = api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S, poll=1)
    assert done["state"] == "success", f"{run_id} ended {done['state']}:\n" + api.explain(DAG_ID, run_id)
    return done


def wait_for_write(api: AirflowApi, run_id: str, hostname: str | None = None, timeout: float = 300) -> dict:
    """The first write_shards task instance seen running (on `hostname`, when given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ti in api.task_instances(DAG_ID, run_id):
            if ti["task_id"] == "write_shards" and ti["state"] == "running" and hostname in (None, ti["hostname"]):
                return ti
        time.sleep(0.2)
    raise AssertionError(f"no write_shards running on {hostname or 'any worker'}:\n" + api.explain(DAG_ID, run_id))


def data_dir(output_root: Path) -> Path:
    (fingerprint,) = [p for p in (output_root / "datasets").iterdir() if p.is_dir()]
    return fingerprint


def shard_set(output_root: Path) -> dict[str, str]:
    """{file: sha256} of the published set: manifest.json, _SUCCESS and every shard the manifest lists."""
    shards = data_dir(output_root) / "shards"
    manifest = json.loads((shards / "manifest.json").read_text())
    files = [f"shards/{s['file']}" for split in manifest["splits"].values() for s in split["shards"]]
    files += ["shards/manifest.json", "shards/_SUCCESS"]
    return {f: sha256(data_dir(output_root) / f) for f in files}


def final_files(output_root: Path) -> list[str]:
    """The published set as paths relative to output_root (what FolderWatch keys on)."""
    prefix = data_dir(output_root).relative_to(output_root)
    return [str(prefix / f) for f in shard_set(output_root)]


def seed_tokenizer(reference: Path, output_root: Path) -> None:
    """The undisturbed run's tokenizer under the same fingerprint: plan_shards reuses it."""
    source = data_dir(reference)
    shutil.copytree(source / "tokenizer", output_root / "datasets" / source.name / "tokenizer")


def tries_retried(api: AirflowApi, run_id: str) -> int:
    return sum(ti["try_number"] - 1 for ti in api.task_instances(DAG_ID, run_id))


@pytest.fixture(scope="module")
def undisturbed(api, shared) -> dict:
    out = shared / "undisturbed"
    t0 = time.monotonic()
    run_id = trigger(api, "celery-undisturbed", out)
    finished(api, run_id)
    figure("undisturbed run (tokenizer + 4 partitions + merge) s", round(time.monotonic() - t0, 1))
    return {"run_id": run_id, "out": out, "tis": api.task_instances(DAG_ID, run_id)}


def test_write_shards_fan_out_over_both_workers_and_queues_route(api, undisturbed):
    tis = undisturbed["tis"]
    writes = [ti for ti in tis if ti["task_id"] == "write_shards"]
    assert sorted(ti["map_index"] for ti in writes) == list(range(PARTS))
    assert all(ti["state"] == "success" and ti["try_number"] == 1 for ti in writes), writes
    # Mapped partitions ran on both machines (the hostname each task instance recorded).
    assert {ti["hostname"] for ti in writes} == set(WORKERS), [(ti["map_index"], ti["hostname"]) for ti in writes]
    figure("write_shards per worker", {h: sum(ti["hostname"] == h for ti in writes) for h in WORKERS})
    # Routing: each task instance's queue, and control tasks only where `control` is consumed.
    for ti in tis:
        want = "cpu" if ti["task_id"] in CPU_TASKS else "control"
        assert ti["queue"] == want, (ti["task_id"], ti["queue"])
        if want == "control":
            assert ti["hostname"] == "worker-a", (ti["task_id"], ti["hostname"])


def test_workers_hold_no_metadata_db_or_token_secret(stack, undisturbed):
    """The workers ran the tasks above (`undisturbed`) with the environment the compose file gives
    them, which has no metadata-DB password, JWT secret, API secret key or Fernet key (docs/security.md,
    "Who holds which secret"): only the broker's and the `celery_results` role's. Read from what each
    worker was started with: /proc/<pid>/environ cannot tell, Celery's setproctitle overwrites it."""
    dotenv = stack.spec.dotenv
    for name in WORKERS:
        environ = "\n".join(f"{k}={v}" for k, v in stack.env_of(name).items())
        for key in (
            "POSTGRES_PASSWORD",
            "AIRFLOW__API_AUTH__JWT_SECRET",
            "AIRFLOW__API__SECRET_KEY",
            "AIRFLOW__CORE__FERNET_KEY",
            "AIRFLOW_ADMIN_PASSWORD",
        ):
            assert dotenv[key] not in environ, f"{name} holds {key}"
        assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in environ
        assert dotenv["CELERY_RESULT_DB_PASSWORD"] in environ and dotenv["REDIS_PASSWORD"] in environ


def test_merged_manifest_equals_a_single_writer(undisturbed, tmp_path):
    """The same counts as one writer over the whole corpus, with the same tokenizer (in this process)."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup import dedup_in_process
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.merge_shards import merge_shards
    from mlm_tasks.steps.write_shards import write_shards
    from peers.tiny_data import tiny_config

    merged = json.loads((data_dir(undisturbed["out"]) / "shards" / "manifest.json").read_text())
    single_root = tmp_path / "single"
    seed_tokenizer(undisturbed["out"], single_root)
    cfg = tiny_config(single_root, **{**DATA, "shards.partitions": 1})
    fingerprint = data_dir(undisturbed["out"]).name
    ctx = RunContext.of(cfg, fingerprint=fingerprint)
    dedup_in_process(cfg, ctx.data, open_corpus(cfg.corpus), 1)  # the stages before the writer, in one partition
    write_shards(cfg, ctx, part=0, num_parts=1)
    merge_shards(cfg, ctx)
    single = json.loads((single_root / "datasets" / fingerprint / "shards" / "manifest.json").read_text())
    keys = ("records", "tokens", "rows", "characters")
    counts = {s: {k: merged["splits"][s][k] for k in keys} for s in merged["splits"]}
    assert counts == {s: {k: single["splits"][s][k] for k in keys} for s in single["splits"]}
    assert counts["train"]["records"] > 0
    figure("merged = single writer (train)", counts["train"])


def test_local_output_root_not_declared_shared_is_refused(api, stack, tmp_path):
    # The mlm-data volume: the deployment lets runs write there, but it is one host's disk.
    not_shared = data_volume(stack) / "not-shared"
    run_id = trigger(api, "celery-unshared", not_shared)
    done = api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S, poll=1)
    assert done["state"] == "failed"
    validate = api.task_instance(DAG_ID, run_id, "validate")
    assert validate["state"] == "failed" and validate["try_number"] == 1  # bad input: no retry
    log = api.log(DAG_ID, run_id, "validate", 1)
    assert "is a local folder, but the CeleryExecutor" in log and "gs://bucket/prefix" in log, log[-3000:]
    assert not not_shared.exists()


def test_sigkill_worker_mid_write_retries_on_the_other(api, stack, undisturbed, shared):
    out = shared / "worker-kill"
    seed_tokenizer(undisturbed["out"], out)
    with FolderWatch(out) as watch:
        run_id = trigger(api, "celery-worker-kill", out)
        victim = wait_for_write(api, run_id, hostname="worker-b")
        killed_at = stack.kill("worker-b")
        part = victim["map_index"]
        while api.tries(DAG_ID, run_id, "write_shards", part)[-1]["state"] != "success":
            assert time.monotonic() - killed_at < RUN_TIMEOUT_S, api.explain(DAG_ID, run_id)
            time.sleep(0.5)
        recovered = time.monotonic() - killed_at
        finished(api, run_id)
    stack.restart("worker-b")  # as found, for the next test

    tries = api.tries(DAG_ID, run_id, "write_shards", part)
    # Try 1 died with worker-b; try 2 ran on worker-a and succeeded.
    assert [(t["try_number"], t["hostname"]) for t in tries] == [(1, "worker-b"), (2, "worker-a")], tries
    assert tries[0]["state"] != "success" and tries[1]["state"] == "success", tries
    files = final_files(out)
    assert watch.partial_sightings(files) == {}, "a reader saw a partial file under its final name"
    assert shard_set(out) == shard_set(undisturbed["out"]), "the shard set differs from the undisturbed run's"
    figure("worker SIGKILL: partition retried on the other worker after s", round(recovered, 1))
    figure("worker SIGKILL: tasks retried", tries_retried(api, run_id))
    figure("worker SIGKILL: folder scans without a partial file", watch.scans)


def test_sigkill_scheduler_mid_run_writes_nothing_twice(api, stack, undisturbed, shared):
    out = shared / "scheduler-kill"
    seed_tokenizer(undisturbed["out"], out)
    with FolderWatch(out) as watch:
        run_id = trigger(api, "celery-scheduler-kill", out)
        wait_for_write(api, run_id)
        stack.kill("airflow-scheduler")
        time.sleep(5)
        restarted_at = time.monotonic()
        stack.restart("airflow-scheduler")
        finished(api, run_id)
        after_restart = time.monotonic() - restarted_at

    tis = api.task_instances(DAG_ID, run_id)
    assert all(ti["try_number"] == 1 for ti in tis), [(ti["task_id"], ti["map_index"], ti["try_number"]) for ti in tis]
    files = final_files(out)
    assert watch.seen(files) == len(files)
    assert watch.rewritten(files) == {}, "a published file was written twice"
    assert watch.partial_sightings(files) == {}
    assert shard_set(out) == shard_set(undisturbed["out"])
    figure("scheduler SIGKILL: run finished after restart in s", round(after_restart, 1))
    figure("scheduler SIGKILL: tasks retried", tries_retried(api, run_id))


def test_redis_down_20s_mid_run_completes_after_it_returns(api, stack, undisturbed, shared):
    out = shared / "redis-outage"
    seed_tokenizer(undisturbed["out"], out)
    with FolderWatch(out) as watch:
        run_id = trigger(api, "celery-redis-outage", out)
        wait_for_write(api, run_id)
        stack.redis.stop()
        time.sleep(20)
        stack.redis.start(stack.spec.commands["redis"])
        back_at = time.monotonic()
        finished(api, run_id)
        after_return = time.monotonic() - back_at

    files = final_files(out)
    assert watch.partial_sightings(files) == {}
    assert shard_set(out) == shard_set(undisturbed["out"])
    figure("Redis down 20 s: run finished after Redis returned in s", round(after_return, 1))
    figure("Redis down 20 s: tasks retried", tries_retried(api, run_id))


def celery_control(stack, *args: str) -> str:
    """The drain commands of docs/operations.md: `celery --app <Airflow's Celery app> ...` with the
    services' environment."""
    import subprocess
    import sys

    celery = str(Path(sys.executable).parent / "celery")
    done = subprocess.run(
        [celery, "--app", "airflow.providers.celery.executors.celery_executor.app", *args],
        env=stack.spec.envs["airflow-worker"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=stack.spec.home,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_drained_worker_takes_no_new_tasks(api, stack, undisturbed, shared):
    """cancel_consumer (docs/operations.md: "Drain a worker") stops worker-b taking tasks; the run goes on worker-a."""
    celery_control(stack, "control", "cancel_consumer", "cpu", "-d", "celery@worker-b")
    try:
        assert "'name': 'cpu'" not in celery_control(stack, "inspect", "active_queues", "-d", "celery@worker-b")
        out = shared / "drained"
        seed_tokenizer(undisturbed["out"], out)
        run_id = trigger(api, "celery-drained", out)
        finished(api, run_id)
        hosts = {ti["hostname"] for ti in api.task_instances(DAG_ID, run_id)}
        assert hosts == {"worker-a"}, hosts
        assert shard_set(out) == shard_set(undisturbed["out"])
    finally:
        celery_control(stack, "control", "add_consumer", "cpu", "-d", "celery@worker-b")
