"""The peak FLOP/s of this CPU in any precision, the denominator of a CPU run's MFU: from the ISA where the
frequency is known, else a GEMM measured once per machine kind and cached. docs/google-cloud.md (MFU)

    peak = cpu_peak()   # CpuPeak(2.1e11, "fp32", "measured peak: fp32 GEMM 2048³, AMD EPYC × 2 cores, ...")
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# FLOPs per cycle per core of the widest unit a flag shows (two FMA pipes, an FMA = 2 FLOPs), from Intel's
# Optimization Reference Manual (AVX-512: 2 × 16 fp32 lanes; AVX2: 2 × 8; AVX-512-BF16's vdpbf16ps: twice
# the fp32 lanes; AMX-BF16: 1024 bf16 FMA a cycle on Sapphire Rapids). A core with one FMA pipe does half.
ISA_FLOPS_PER_CYCLE: tuple[tuple[str, str, int], ...] = (
    ("amx_bf16", "bf16", 2048),
    ("avx512_bf16", "bf16", 128),
    ("avx512f", "fp32", 64),
    ("avx2", "fp32", 32),
)
GEMM_SIZE, WINDOWS, WINDOW_S = 2048, 4, 0.5
CACHE_FILE = "mlm-pretrain/cpu-peak.json"


@dataclass(frozen=True)
class CpuPeak:
    flops: float  # FLOP/s of the whole host (every core the process may use)
    precision: str  # the precision that peak is reached in
    source: str


def cpu_info(text: str | None = None) -> dict[str, Any]:
    """Model name, flags and the cores this process may use, from /proc/cpuinfo (or `text`)."""
    if text is None:
        text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    return {
        "model": model.group(1).strip() if model else "unknown CPU",
        "flags": set(flags.group(1).split()) if flags else set(),
        "cores": _cores(),
    }


def _cores() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def max_frequency_hz(model: str) -> float | None:
    """The cores' maximum frequency: cpufreq's cpuinfo_max_freq, else the "@ X.XXGHz" of the model name."""
    path = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if path.exists():
        return float(path.read_text().strip()) * 1e3  # kHz
    named = re.search(r"@\s*([0-9.]+)\s*GHz", model)
    return float(named.group(1)) * 1e9 if named else None


def _unit_name(flag: str) -> str:
    return flag.upper().replace("_", "-")  # avx512_bf16 -> AVX512-BF16


def isa_peak(flags: set[str], cores: int, hz: float) -> CpuPeak | None:
    """cores × FLOPs per cycle of the widest unit the flags show × frequency (None: no unit known)."""
    for flag, precision, per_cycle in ISA_FLOPS_PER_CYCLE:
        if flag in flags:
            source = f"{_unit_name(flag)}: {cores} cores × {hz / 1e9:.2f} GHz × {per_cycle} FLOP/cycle"
            return CpuPeak(cores * hz * per_cycle, precision, source)
    return None


def gemm_rate(precision: str, size: int = GEMM_SIZE) -> float:
    """FLOP/s of a `size`³ matrix multiply in `precision`, the best of WINDOWS windows of WINDOW_S."""
    import tensorflow as tf

    dtype = tf.bfloat16 if precision == "bf16" else tf.float32
    a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)) / size**0.5, dtype)
    matmul = tf.function(lambda x: tf.matmul(x, a))
    matmul(a).numpy()  # trace and warm up
    rates = []
    for _ in range(WINDOWS):  # a window on a busy moment reads low: the best is what the cores reach
        runs, began = 0, time.perf_counter()
        while runs == 0 or time.perf_counter() - began < WINDOW_S:
            matmul(a).numpy()
            runs += 1
        rates.append(runs * 2 * size**3 / (time.perf_counter() - began))
    return max(rates)


def machine_kind(info: dict[str, Any]) -> str:
    """ "AMD EPYC (AVX512-BF16) × 2 cores", the cache's key: the widest unit tells apart kinds one model name covers."""
    widest = next((_unit_name(flag) for flag, _, _ in ISA_FLOPS_PER_CYCLE if flag in info["flags"]), None)
    return f"{info['model']}{f' ({widest})' if widest else ''} × {info['cores']} cores"


def measured_peak(info: dict[str, Any]) -> CpuPeak:
    """The best GEMM rate of fp32 and bf16 on this machine kind, from the cache or measured, then cached unless
    the machine was busy. Each writer renames a whole file into place, so two at once never leave it torn."""
    kind = machine_kind(info)
    env = os.environ.get("MLM_CPU_PEAK_CACHE")  # the tests' own
    path = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / CACHE_FILE
    cache = json.loads(path.read_text()) if path.exists() else {}
    entry, where = cache.get(kind), f"cached in {path}"
    if entry is None:
        load = busy_load()
        rates = {precision: gemm_rate(precision) for precision in ("fp32", "bf16")}
        best = max(rates, key=lambda p: rates[p])
        entry = {"flops": rates[best], "precision": best, "rates": rates, "at": time.strftime("%Y-%m-%d")}
        load = load if load is not None else busy_load()  # busy before or after: not the machine's figure
        if load is not None:
            where = f"not cached: the machine was busy, load {load:.1f}"
        else:
            cache[kind] = entry
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{os.getpid()}")
            partial.write_text(json.dumps(cache, indent=1))
            partial.replace(path)
    source = f"measured peak: {entry['precision']} GEMM {GEMM_SIZE}³, {kind}, {entry['at']} ({where})"
    return CpuPeak(float(entry["flops"]), entry["precision"], source)


def cpu_peak() -> CpuPeak:
    info = cpu_info()
    hz = max_frequency_hz(info["model"])
    from_isa = isa_peak(info["flags"], info["cores"], hz) if hz else None
    return from_isa or measured_peak(info)


def busy_load() -> float | None:
    """The 1-minute load average when over 1.5x the cores (None: quiet enough; the run's own work reaches ~1x)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return load if load > 1.5 * _cores() else None
