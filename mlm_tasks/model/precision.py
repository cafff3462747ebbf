"""The compute dtype `train.mixed_precision: auto` picks, and what the CPU can do in bf16.

    precision = auto_precision(device)      # "bf16" on TPU and GPU; on CPU see CPU_BF16_AUTO
    cpu_bf16_units()                        # ["amx_bf16", "avx512_bf16"] on a Sapphire Rapids Xeon

A CPU with bf16 matrix units (Intel AMX-BF16, or AVX512-BF16 on Intel Cooper Lake+ and AMD Zen 4+)
runs oneDNN's bf16 matrix multiplies faster than fp32; one without them emulates bf16 and is slower.
The masked-LM loss casts the LM head's logits to fp32, so the softmax stays exact either way.
"""

from __future__ import annotations

from typing import Literal

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flag names (Linux)

# Whether auto picks bf16 on a CPU with bf16 units: set from bench/bench_quality.py's measurement on
# the embedded default (bench/RESULTS.md, section 9), not assumed: on a quiet 2-core AMD EPYC (Zen 4,
# AVX512-BF16) bf16 trained at 1.15-1.4x fp32's tokens/s with the same loss per step (on the same
# machine under heavy load the two were level); the one-thread probe found 1.27x on an AMX Xeon.
CPU_BF16_AUTO = True


def cpu_bf16_units(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The bf16 matrix-unit flags of this CPU (empty off Linux, or on a CPU without them)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in BF16_FLAGS if flag in flags]


def auto_precision(device: str, cpuinfo: str = "/proc/cpuinfo") -> Literal["off", "bf16"]:
    """`train.mixed_precision: auto` on `device` (cpu, gpu or tpu): "bf16" or "off" (fp32)."""
    if device != "cpu":
        return "bf16"
    return "bf16" if CPU_BF16_AUTO and cpu_bf16_units(cpuinfo) else "off"
