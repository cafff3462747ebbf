"""Shared helpers of the benchmarks: the prepared embedded corpus, subprocess workers, tables, the machine.

Every benchmark prepares (once, cached) the embedded corpus with $MLM_BENCH_CONFIG (default
configs/default.yaml; tests point it at configs/tiny.yaml) under $MLM_BENCH_ROOT (default /tmp/mlm-bench),
then times each variant in a fresh subprocess so that no variant inherits another's warm caches, threads or
imports. Import time is excluded: the worker starts its clock after its imports.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH_ROOT = os.environ.get("MLM_BENCH_ROOT", "/tmp/mlm-bench")
BENCH_CONFIG = os.environ.get("MLM_BENCH_CONFIG", os.path.join(REPO, "configs", "default.yaml"))
MAX_LENGTH = 128


def bench_config(**overrides):
    from mlm_tasks.config import load_config

    return load_config(BENCH_CONFIG, {"output_root": BENCH_ROOT, **overrides})


def prepared() -> dict:
    """build_shard_set on the embedded corpus (cached by fingerprint); the data summary."""
    import logging

    from mlm_tasks.steps import build_shard_set

    logging.disable(logging.INFO)
    return build_shard_set(bench_config())


def train_rows() -> list[str]:
    """The embedded corpus' train rows, materialised once (reading the bz2 dump is not what is timed)."""
    path = os.path.join(BENCH_ROOT, "train-rows.pkl")
    if not os.path.exists(path):
        from mlm_tasks.data.corpus import open_corpus

        rows = list(open_corpus(bench_config().corpus).rows("train"))
        os.makedirs(BENCH_ROOT, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            pickle.dump(rows, f)
        os.replace(path + ".tmp", path)
    with open(path, "rb") as f:
        return pickle.load(f)


def run_worker(script: str, *args: str, env: dict | None = None) -> dict:
    """Run `script --worker args...` in a fresh process; its last stdout line is a JSON result.
    Adds `peak_rss_mb` of that child alone (os.wait4), whatever it imported."""
    import tempfile

    cmd = [sys.executable, script, "--worker", *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)  # reaps it ourselves, for this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.time() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result.setdefault("wall_s", wall)
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(result: dict) -> None:
    """A worker's result: one JSON line on stdout, last."""
    print(json.dumps(result), flush=True)


def median(values):
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (pastes straight into bench/RESULTS.md)."""

    def fmt(v):
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1 else f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=False)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(c) for c in cells])


def machine() -> str:
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.processor())
    mem = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.strip().splitlines()
    load = os.getloadavg()
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')} · {os.cpu_count()} CPUs ({cpu}) · "
        f"{mem[1].split()[1] if len(mem) > 1 else '?'} RAM · load avg {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} "
        f"· Python {platform.python_version()}"
    )
