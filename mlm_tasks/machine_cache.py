"""Figures measured once per machine kind and kept between runs: the CPU's peak FLOP/s
(mlm_tasks/model/cpu_peak.py) and which precision trains a model faster (mlm_tasks/model/precision.py).

    path = machine_cache.path("mlm-pretrain/cpu-peak.json", "MLM_CPU_PEAK_CACHE")
    entry = machine_cache.entry(path, "shape-key", measure)   # measure() -> dict, run once, then cached

A file under $XDG_CACHE_HOME (~/.cache), or the one an environment variable names (the tests' own). Each
entry is keyed by the machine kind (CPU model × the cores this process may use) plus what the caller adds,
and dated; delete the file to measure again on an idle machine.
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


def entry(file: Path, key: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The cached entry `key`, or `measure()`'s (dated, then cached). Two processes measuring at once each
    write the whole file by rename, so neither leaves it torn."""
    cache = json.loads(file.read_text()) if file.exists() else {}
    if key not in cache:
        cache[key] = {**measure(), "at": time.strftime("%Y-%m-%d")}
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(f"{file.name}.{os.getpid()}")
        partial.write_text(json.dumps(cache, indent=1))
        partial.replace(file)
    return dict(cache[key])
