"""Benchmark 2: peak RSS of the shard writer at 1x and 10x the corpus (streaming, not materialising it).

    .venv/bin/python bench/bench_memory.py [--factors 1,10]

The embedded corpus' rows (every split) are written k times over into a .txt file; a fresh subprocess
runs the one shard writer over it as a local_files corpus, as build_shard_set does (mlm_tasks.data.writer:
one partition, all three splits, merge and publish included)
with the embedded tokenizer. Peak RSS is the child's own ru_maxrss (os.wait4); "working set" is the
peak minus the RSS just before writing began (imports and tokenizer excluded). Target: peak at 10x
<= 1.2x peak at 1x.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


def corpus_file(factor: int) -> str:
    path = os.path.join(common.BENCH_ROOT, f"corpus-x{factor}.txt")
    if not os.path.exists(path):
        from mlm_tasks.data.corpus import open_corpus

        corpus = open_corpus(common.bench_config().corpus)
        rows = [r for split in ("train", "validation", "test") for r in corpus.rows(split)]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for _ in range(factor):
                f.writelines(r.replace("\n", " ") + "\n" for r in rows)
        os.replace(path + ".tmp", path)
    return path


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(factor: str) -> None:
    import shutil

    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.dedup import dedup_in_process
    from mlm_tasks.data.writer import merge_partitions, write_partition
    from mlm_tasks.paths import DataPaths

    # The writer alone: every row written, as before the dedup stages (bench 13 measures those).
    overrides = {"dedup.exact": False, "corpus.filters.enabled": False}
    cfg = common.bench_config(
        **{"corpus.source": "local_files", "corpus.local_paths": [corpus_file(int(factor))], **overrides}
    )
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as root:
        paths = DataPaths(root, "mem")
        shutil.copytree(common.prepared()["tokenizer_uri"], paths.tokenizer)
        dedup_in_process(cfg, paths, open_corpus(cfg.corpus), 1)
        before = _status_mb("VmRSS")
        t0 = time.perf_counter()
        write_partition(cfg, paths, 0, 1)
        shard_set = merge_partitions(cfg, paths, 1, {})
        seconds = time.perf_counter() - t0
    common.emit(
        {
            "factor": int(factor),
            "rss_before_mb": before,
            "hwm_mb": _status_mb("VmHWM"),
            "seconds": seconds,
            "tokens": sum(shard_set.tokens(s) for s in shard_set.splits),
            "file_mb": os.path.getsize(corpus_file(int(factor))) / 2**20,
        }
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--factors", default="1,10")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    common.prepared()
    factors = [int(f) for f in args.factors.split(",")]
    for f in factors:
        corpus_file(f)
    results = [common.run_worker(__file__, str(f)) for f in factors]
    base = results[0]
    rows = [
        [
            f"{r['factor']}x",
            r["file_mb"],
            r["tokens"],
            r["seconds"],
            r["tokens"] / r["seconds"],
            r["peak_rss_mb"],
            r["peak_rss_mb"] - r["rss_before_mb"],
            r["peak_rss_mb"] / base["peak_rss_mb"],
        ]
        for r in results
    ]
    print(f"\n{common.machine()}\n")
    print(
        common.table(
            ["corpus", "text MB", "tokens written", "s", "tokens/s", "peak RSS MB", "working set MB", "peak / 1x peak"],
            rows,
        )
    )
    print("\ntarget: peak RSS at 10x <= 1.2x the peak at 1x")


if __name__ == "__main__":
    main()
