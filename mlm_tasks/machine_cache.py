"""Figures measured once per machine kind and kept between runs: the CPU's peak FLOP/s
(mlm_tasks/model/cpu_peak.py).

    path = machine_cache.path("mlm-pretrain/cpu-peak.json", "MLM_CPU_PEAK_CACHE")
    entry = machine_cache.entry(path, "shape-key", measure)   # measure() -> dict, run once, then cached

A file under $XDG_CACHE_HOME (~/.cache), or the one an environment variable names (the tests' own). Each
entry is keyed by the machine kind (CPU model × the cores this process may use) plus what the caller adds,
and dated; delete the file to measure again on an idle machine. A measurement taken while the machine is busy
(a load average over 1.5x its cores: another job beside the run, a test suite) is used for that run only and not cached,
so it cannot stand for the machine kind afterwards (one taken beside a CI run once cached a CPU peak of a
ninth of the real one, and every later run read MFU over 400%).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def path(name: str, env: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / name


def busy_load() -> float | None:
    """The 1-minute load average when it is over 1.5x the cores this process may use (None: quiet enough). The
    run's own work just before (writing shards, the measurement itself) brings it to about the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return load if load > 1.5 * cores else None


def entry(file: Path, key: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The cached entry `key`, or `measure()`'s (dated, then cached unless the machine was busy: then the
    entry carries `busy_load` and is not written). Two processes measuring at once each write the whole file by
    rename, so neither leaves it torn."""
    cache = json.loads(file.read_text()) if file.exists() else {}
    if key not in cache:
        load = busy_load()
        measured = {**measure(), "at": time.strftime("%Y-%m-%d")}
        load = load if load is not None else busy_load()  # busy before or after: not the machine's figure
        if load is not None:
            return {**measured, "busy_load": load}
        cache[key] = measured
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(f"{file.name}.{os.getpid()}")
        partial.write_text(json.dumps(cache, indent=1))
        partial.replace(file)
    return dict(cache[key])
