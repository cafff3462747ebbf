"""The compute dtype `train.mixed_precision: auto` picks: bf16 on a TPU or GPU; on a CPU, whichever of fp32
and bf16 trains the run's own model faster on this machine, timed once per machine kind and model shape.

    choice = auto_precision("cpu", key, measure)   # PrecisionChoice("off", "fp32: 1.31x bf16's steps/s ...")

Why timed and not read from the CPU's flags: TensorFlow's CPU kernels decide, not the ISA. On an Intel Xeon
with AVX-512-BF16 its bf16 matmuls ran at about half the fp32 rate; on a Zen 4 EPYC bf16 trained at
1.15-1.4x fp32; on an AVX2-only EPYC (bf16 emulated) at 0.74x (bench/RESULTS.md). `measure(precision)`
returns seconds per step of a throwaway copy of the run's model in that precision ("off" is fp32); the
two figures are cached under the machine kind and the model's shape (`key`) in CACHE_FILE
($XDG_CACHE_HOME, or MLM_PRECISION_CACHE), so only a machine's first run of a shape pays for the timing
(~2 × 10 s for the embedded default). The masked-LM loss casts the LM head's logits to fp32, so the
softmax stays exact either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mlm_tasks import machine_cache

CACHE_FILE = "mlm-pretrain/precision.json"
CACHE_ENV = "MLM_PRECISION_CACHE"
NAMES = {"off": "fp32", "bf16": "bf16"}


@dataclass(frozen=True)
class PrecisionChoice:
    precision: Literal["off", "bf16"]
    reason: str  # what the summary prints: which, and why


def auto_precision(device: str, key: str, measure: Callable[[str], float]) -> PrecisionChoice:
    """`train.mixed_precision: auto` on `device` (cpu, gpu or tpu) for the model `key` names."""
    if device != "cpu":
        return PrecisionChoice("bf16", f"bf16: the {device.upper()}'s matrix units run it natively")
    path = machine_cache.path(CACHE_FILE, CACHE_ENV)
    entry = machine_cache.entry(path, key, lambda: {"seconds_per_step": {p: measure(p) for p in NAMES}})
    timed: dict[str, float] = entry["seconds_per_step"]
    faster: Literal["off", "bf16"] = "bf16" if timed["bf16"] < timed["off"] else "off"
    slower = "off" if faster == "bf16" else "bf16"
    reason = (
        f"{NAMES[faster]}: {timed[slower] / timed[faster]:.2f}x {NAMES[slower]}'s steps/s for this model on this CPU "
        f"({1000 * timed['off']:.1f} ms/step fp32, {1000 * timed['bf16']:.1f} bf16; timed {entry['at']}, "
        + (
            f"not cached: the machine was busy, load {entry['busy_load']:.1f})"
            if "busy_load" in entry
            else f"cached in {path})"
        )
    )
    return PrecisionChoice(faster, reason)
