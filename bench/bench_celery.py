"""Benchmark 7: shard writing under the CeleryExecutor, 1 vs 2 workers, and the per-task overhead.

    .venv/bin/python bench/bench_celery.py [--factor 4] [--rounds 2] [--overhead-tasks 24]

The real deployment on loopback (tests/peers/airflow_stack.py with the CeleryExecutor: PostgreSQL,
redis-server, api-server, scheduler, dag-processor, triggerer), `mlm_dataset_refresh` triggered through
the REST API, timed from the task instances the API reports:

1. Shard writing: the embedded corpus ×`factor` as a local .txt (what bench 3 writes), the tokenizer
   already in place (plan_shards reuses it), `shards.partitions: 2`. Timed from the end of
   `plan_shards` to the end of `build_shards` (the merge): both write_shards tasks, their queueing,
   dispatch through Redis, task start-up and the merge — scheduling overhead included. Workers have one
   task slot each and are held to one core each with `taskset` (worker-a core 0, worker-b core 1);
   variants: 1 worker with partitions 2 and 1, and 2 workers. The Airflow services share the cores.
2. Per-task overhead: one run with `--overhead-tasks` mapped write_shards tasks of the tiny corpus on the
   two workers. Per task: queued → running (TI `queued_when` → `start_date`), and the part of it
   that is overhead alone: from max(queued, the end of that worker's previous task) to running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from bench_memory import corpus_file

sys.path.insert(0, os.path.join(common.REPO, "tests"))
from peers.airflow_rest import AirflowApi
from peers.airflow_stack import running_stack

DAG_ID = "mlm_dataset_refresh"
TINY = os.path.join(common.REPO, "configs", "tiny.yaml")
DEFAULT = os.path.join(common.REPO, "configs", "default.yaml")


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def corpus_overrides(factor: int, parts: int) -> dict:
    return {"corpus.source": "local_files", "corpus.local_paths": [corpus_file(factor)], "shards.partitions": parts}


def seed_tokenizer(out: Path, factor: int) -> None:
    """The prepared tokenizer under this corpus' fingerprint, as bench 3 copies it: only writing is timed."""
    from mlm_tasks.data.shard_set import data_fingerprint
    from mlm_tasks.paths import DataPaths

    cfg = common.bench_config(**{**corpus_overrides(factor, 1), "output_root": str(out)})
    shutil.copytree(common.prepared()["tokenizer_uri"], DataPaths(str(out), data_fingerprint(cfg)).tokenizer)


def run(api: AirflowApi, run_id: str, conf: dict) -> list[dict]:
    api.trigger(DAG_ID, conf=conf, run_id=run_id)
    done = api.wait_for_run(DAG_ID, run_id, timeout=1800, poll=1)
    if done["state"] != "success":
        raise RuntimeError(f"{run_id} {done['state']}:\n{api.explain(DAG_ID, run_id)}")
    return api.task_instances(DAG_ID, run_id)


def fanout_seconds(tis: list[dict]) -> dict:
    by = {(t["task_id"], t["map_index"]): t for t in tis}
    plan_end = ts(by[("plan_shards", -1)]["end_date"])
    writes = [t for t in tis if t["task_id"] == "write_shards"]
    return {
        "wall_s": ts(by[("build_shards", -1)]["end_date"]) - plan_end,
        "task_s": [round(ts(t["end_date"]) - ts(t["start_date"]), 2) for t in writes],
        "hosts": sorted(t["hostname"] for t in writes),
    }


def overhead(tis: list[dict]) -> tuple[list[float], list[float]]:
    """(queued → running, overhead alone) in seconds, per mapped write_shards task."""
    writes = sorted((t for t in tis if t["task_id"] == "write_shards"), key=lambda t: ts(t["start_date"]))
    queued_to_running, alone, last_end = [], [], {}
    for t in writes:
        queued, start = ts(t["queued_when"]), ts(t["start_date"])
        queued_to_running.append(start - queued)
        alone.append(start - max(queued, last_end.get(t["hostname"], queued)))
        last_end[t["hostname"]] = ts(t["end_date"])
    return queued_to_running, alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--overhead-tasks", type=int, default=24, help="0: skip the per-task overhead run")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an Airflow setting for every process, on top of the compose file's (A/B of a setting)",
    )
    args = ap.parse_args()

    common.prepared()
    corpus_file(args.factor)
    shared = Path(tempfile.mkdtemp(prefix="bench-celery-"))
    load_before = os.getloadavg()
    env = {
        "MLM_SHARED_OUTPUT_ROOTS": str(shared),
        "MLM_REFRESH_SCHEDULE": "none",
        "MLM_RETRY_DELAY_S": "5",
        **dict(kv.split("=", 1) for kv in args.env),
    }
    results: dict[str, list[dict]] = {}
    try:
        with running_stack(shared / "stack", executor="CeleryExecutor", extra_env=env) as stack:
            api = AirflowApi(stack.url, stack.token)
            api.unpause(DAG_ID)
            stack.start_worker("worker-a", "cpu,control", cpus="0")
            # Warm-up: the first run pays the first parse and imports in every process.
            out = shared / "warmup"
            seed_tokenizer(out, args.factor)
            run(
                api,
                "warmup",
                {"config_file": DEFAULT, "output_root": str(out), "overrides": corpus_overrides(args.factor, 1)},
            )
            variants = [("1 worker, partitions 1", 1, 1), ("1 worker, partitions 2", 1, 2), ("2 workers", 2, 2)]
            env_note = {
                k: stack.env_of("airflow-scheduler").get(k) for k in ("AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL",)
            }
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for name, workers, parts in order:
                    running = "worker-b" in stack.procs.running
                    if workers == 2 and not running:
                        stack.start_worker("worker-b", "cpu", cpus="1")
                    if workers == 1 and running:
                        stack.stop("worker-b")
                    out = shared / f"r{r}-{workers}w{parts}p"
                    seed_tokenizer(out, args.factor)
                    tis = run(
                        api,
                        f"r{r}-{workers}w{parts}p",
                        {
                            "config_file": DEFAULT,
                            "output_root": str(out),
                            "overrides": corpus_overrides(args.factor, parts),
                        },
                    )
                    figures = fanout_seconds(tis)
                    manifest = json.loads(next((out / "datasets").glob("*/shards/manifest.json")).read_text())
                    figures["tokens"] = sum(s["tokens"] for s in manifest["splits"].values())
                    results.setdefault(name, []).append(figures)
                    print(f"round {r + 1} {name}: {figures}", flush=True)
            queued_to_running, alone = [], []
            if args.overhead_tasks:
                if "worker-b" not in stack.procs.running:
                    stack.start_worker("worker-b", "cpu", cpus="1")
                tis = run(
                    api,
                    "overhead",
                    {
                        "config_file": TINY,
                        "output_root": str(shared / "overhead"),
                        "overrides": {"shards.partitions": args.overhead_tasks},
                    },
                )
                queued_to_running, alone = overhead(tis)
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    print(
        f"\n```\n{common.machine()}\nload avg before the stack started: "
        f"{load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}; {env_note}\n```\n"
    )
    best_one = min(
        (common.median([f["wall_s"] for f in results[n]]) for n in results if n.startswith("1 worker")), default=0
    )
    rows = []
    for name, runs in results.items():
        wall = common.median([f["wall_s"] for f in runs])
        rows.append(
            [
                name,
                wall,
                runs[0]["tokens"] / wall,
                best_one / wall,
                " ".join(f"{f['wall_s']:.1f}" for f in runs),
                "; ".join(" ".join(str(s) for s in f["task_s"]) for f in runs),
                " ".join(sorted(set(h for f in runs for h in f["hosts"]))),
            ]
        )
    if rows:
        print(
            common.table(
                [
                    "variant",
                    "median s plan end → merge end",
                    "tokens/s",
                    "speed-up vs best 1 worker",
                    "runs (s)",
                    "write_shards task s",
                    "workers",
                ],
                rows,
            )
        )
    if not alone:
        return
    print()
    print(
        common.table(
            ["per mapped task (n)", "median s", "p90 s", "min s", "max s"],
            [
                [
                    f"queued → running ({len(queued_to_running)})",
                    statistics.median(queued_to_running),
                    sorted(queued_to_running)[int(0.9 * (len(queued_to_running) - 1))],
                    min(queued_to_running),
                    max(queued_to_running),
                ],
                [
                    f"overhead alone: max(queued, slot free) → running ({len(alone)})",
                    statistics.median(alone),
                    sorted(alone)[int(0.9 * (len(alone) - 1))],
                    min(alone),
                    max(alone),
                ],
            ],
        )
    )


if __name__ == "__main__":
    main()
