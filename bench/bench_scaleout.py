"""Benchmark 3: shard writing fanned out over worker processes (mlm_tasks.data.writer), 1 vs 2 workers.

    .venv/bin/python bench/bench_scaleout.py [--factor 4] [--rounds 2]

Corpus: the embedded corpus' rows repeated `factor` times in a .txt (local_files source), all splits.
Each worker is a fresh process running write_partition(cfg, paths, part, num_parts), what one mapped
`write_shards` task runs; it reads only its own byte range (LocalFilesCorpus.split_rows, all splits in one read).
Workers import, then wait at a barrier so only the writing is timed; the merge (merge_partitions)
runs after the last worker and is included. A worker is one executor slot on one core: one tokenizer
thread (TOKENIZERS_PARALLELISM=false). "1 worker, threads" is one process whose tokenizer uses its own
thread pool over both cores, the strongest one-process baseline. A worker still overlaps encoding
with writing in a second thread (mlm_tasks.data.writer.encoded_batches), so unpinned, one worker already uses
part of the idle second core; the "pinned" variants hold each worker to its own core
(sched_setaffinity), which is what "one worker = one core" means exactly. Each worker's CPU seconds are reported
too: on a machine shared with other work, wall time measures the scheduler's share, not the writer. The merged
manifest's counts are
compared with those of one partition of one (what build_shard_set writes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from bench_memory import corpus_file

COUNTS = ("records", "tokens", "rows", "characters")


def _cfg(factor: int):
    # The writer alone: every row written, as before the dedup stages (they have bench 12 and 13).
    return common.bench_config(
        **{
            "corpus.source": "local_files",
            "corpus.local_paths": [corpus_file(factor)],
            "dedup.exact": False,
            "corpus.filters.enabled": False,
        }
    )


def _dedup(factor: int, root: str, num_parts: int) -> None:
    """The stages before the writer (here they only mark nothing removed), untimed."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup import dedup_in_process

    cfg = _cfg(factor)
    dedup_in_process(cfg, _paths(root), open_corpus(cfg.corpus), num_parts)


def _paths(root: str):
    from mlm_tasks.paths import DataPaths

    return DataPaths(root, "scaleout")


def worker(arg: str) -> None:
    factor, part, num_parts, cpu, root = arg.split(":", 4)
    from mlm_tasks.data.writer import write_partition

    if int(cpu) >= 0:  # one core per worker, as a deployment with one executor slot per core pins it
        os.sched_setaffinity(0, {int(cpu)})

    cfg, paths = _cfg(int(factor)), _paths(root)
    go = os.path.join(root, "go")
    open(os.path.join(root, f"ready-{part}"), "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    t0, c0 = time.time(), time.process_time()
    partial = write_partition(cfg, paths, int(part), int(num_parts))
    common.emit(
        {
            "start": t0,
            "end": time.time(),
            "cpu_s": time.process_time() - c0,
            "records": sum(s["records"] for s in partial["splits"].values()),
        }
    )


def run_fanout(factor: int, num_parts: int, env: dict, pin: bool = False) -> tuple[float, float, dict]:
    """Wall seconds (barrier to merged manifest), CPU seconds of the busiest worker, the manifest."""
    from mlm_tasks.data.writer import merge_partitions

    root = tempfile.mkdtemp(prefix="bench-scaleout-")
    try:
        shutil.copytree(common.prepared()["tokenizer_uri"], _paths(root).tokenizer)
        _dedup(factor, root, num_parts)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", f"{factor}:{p}:{num_parts}:{p if pin else -1}:{root}"],
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, **env},
            )
            for p in range(num_parts)
        ]
        while not all(os.path.exists(os.path.join(root, f"ready-{p}")) for p in range(num_parts)):
            if any(p.poll() for p in procs):
                raise RuntimeError("a worker failed before the barrier")
            time.sleep(0.01)
        t0 = time.time()
        open(os.path.join(root, "go"), "w").close()
        results = []
        for p in procs:
            out, _ = p.communicate()
            if p.returncode:
                raise RuntimeError(f"worker failed ({p.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
        manifest = merge_partitions(_cfg(factor), _paths(root), num_parts, {}).data
        return time.time() - t0, max(r["cpu_s"] for r in results), manifest
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_single(factor: int) -> dict:
    """One partition of one, in this process: what build_shard_set writes."""
    from mlm_tasks.data.writer import merge_partitions, write_partition

    cfg = _cfg(factor)
    with tempfile.TemporaryDirectory(prefix="bench-single-") as root:
        shutil.copytree(common.prepared()["tokenizer_uri"], _paths(root).tokenizer)
        _dedup(factor, root, 1)
        write_partition(cfg, _paths(root), 0, 1)
        return merge_partitions(cfg, _paths(root), 1, {}).data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    import logging

    common.prepared()
    corpus_file(args.factor)
    logging.disable(logging.INFO)
    one_thread = {"TOKENIZERS_PARALLELISM": "false"}
    variants = {
        "1 worker, threads": (1, {}),
        "1 worker": (1, one_thread),
        "2 workers": (2, one_thread),
        "1 worker, pinned": (1, one_thread, True),
        "2 workers, pinned": (2, one_thread, True),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    manifests = {}
    for r in range(args.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            seconds, busiest, manifests[name] = run_fanout(args.factor, *variants[name])
            times[name].append(seconds)
            cpu[name].append(busiest)
            print(f"round {r + 1} {name}: {seconds:.2f}s wall, busiest worker {busiest:.2f} CPU s", file=sys.stderr)
    single = run_single(args.factor)
    tokens = manifests["2 workers"]["splits"]["train"]["tokens"] + sum(
        manifests["2 workers"]["splits"][s]["tokens"] for s in ("validation", "test")
    )
    threaded = common.median(times["1 worker, threads"])

    def one(v: str) -> float:  # the 1-worker run of the same kind (pinned or not)
        return common.median(times["1 worker, pinned" if "pinned" in v else "1 worker"])

    print(
        f"\n{common.machine()}\ncorpus: embedded rows x{args.factor} (local_files), {tokens:,} tokens written; "
        f"median of {args.rounds} alternating rounds\n"
    )
    one_cpu = common.median(cpu["1 worker"])
    print(
        common.table(
            [
                "variant",
                "median wall s (write + merge)",
                "tokens/s",
                "wall speed-up vs 1 worker alike",
                "vs 1 worker, threads",
                "busiest worker CPU s",
                "CPU-bound speed-up",
                "wall runs (s)",
            ],
            [
                [
                    v,
                    common.median(t),
                    tokens / common.median(t),
                    one(v) / common.median(t),
                    threaded / common.median(t),
                    common.median(cpu[v]),
                    one_cpu / common.median(cpu[v]),
                    " ".join(f"{x:.2f}" for x in t),
                ]
                for v, t in times.items()
            ],
        )
    )
    print(
        "\nCPU-bound speed-up = CPU s of the 1-worker run / CPU s of the busiest worker: the wall speed-up on "
        "cores nobody else uses (wall figures only hold when the cores are otherwise idle)."
    )
    rows = []
    for split in ("train", "validation", "test"):
        a, b = single["splits"][split], manifests["2 workers"]["splits"][split]
        rows.append(
            [split] + [f"{a[k]:,} / {b[k]:,}" for k in COUNTS] + ["yes" if all(a[k] == b[k] for k in COUNTS) else "NO"]
        )
    print("\none partition (build_shard_set) vs merged 2-worker manifest:\n")
    print(common.table(["split", *COUNTS, "equal"], rows))
    print("\ntarget: 2 workers >= 1.7x one worker; merged counts equal the single writer's")


if __name__ == "__main__":
    main()
