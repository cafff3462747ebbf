"""How many hosts (TPU VMs) an accelerator type has, and which runtimes fit it.

    tpu_slices.hosts("v4-32")                    # 4
    tpu_slices.check_runtime("v4-32", "tpu-vm-tf-2.16.1-pjrt")   # ConfigError: needs a -pod runtime

A multi-host slice needs a `-pod` runtime, and a one-host slice must not use one. `GENERATIONS` follows
Google's "TPU versions" pages: v2-v4 and v5p count TensorCores (8 per host), v5litepod and v6e chips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlm_tasks.errors import ConfigError
from mlm_tasks.tpu import runtimes


@dataclass(frozen=True)
class Generation:
    units_per_host: int  # type-suffix units on one host of a multi-host slice
    single_host_max: int  # largest suffix that is still one host
    sizes: frozenset[int] | None = None  # allowed suffixes when not "multiples of units_per_host"
    max_size: int = 0


GENERATIONS = {
    "v2": Generation(8, 8, max_size=512),
    "v3": Generation(8, 8, max_size=2048),
    "v4": Generation(8, 8, max_size=8192),
    "v5p": Generation(8, 8, max_size=12288),
    "v5litepod": Generation(4, 8, sizes=frozenset({1, 4, 8, 16, 32, 64, 128, 256})),
    "v6e": Generation(4, 8, sizes=frozenset({1, 4, 8, 16, 32, 64, 128, 256})),
}


TYPE_PATTERN = re.compile(r"^(?P<gen>[a-z0-9]+)-(?P<size>[1-9][0-9]*)$")
POD_RUNTIME = re.compile(r"-pod(-|$)")


def parse(accelerator_type: str) -> tuple[str, int]:
    """("v4", 32) from "v4-32"; ConfigError naming the accepted forms otherwise."""
    match = TYPE_PATTERN.match(accelerator_type)
    gen = GENERATIONS.get(match["gen"]) if match else None
    if match is None or gen is None:
        raise ConfigError(
            f"tpu.accelerator_type {accelerator_type!r} is not a TPU type: use "
            f"<generation>-<size> with a generation among {sorted(GENERATIONS)}, e.g. v4-8, "
            "v5litepod-8, v5p-8 or v4-32 (a pod slice)."
        )
    size = int(match["size"])
    ok = size in gen.sizes if gen.sizes else (size % gen.units_per_host == 0 and size <= gen.max_size)
    if not ok:
        allowed = sorted(gen.sizes) if gen.sizes else f"multiples of {gen.units_per_host} up to {gen.max_size}"
        raise ConfigError(f"tpu.accelerator_type {accelerator_type!r}: {match['gen']} comes in sizes {allowed}.")
    return match["gen"], size


def hosts(accelerator_type: str) -> int:
    """TPU VMs (workers) in a slice of this type: the API returns one network endpoint per host."""
    gen_name, size = parse(accelerator_type)
    gen = GENERATIONS[gen_name]
    return 1 if size <= gen.single_host_max else size // gen.units_per_host


def check_runtime(accelerator_type: str, runtime_version: str) -> int:
    """The host count, once the runtime fits it (`-pod` exactly on a multi-host slice) and TensorFlow runs there."""
    generation = parse(accelerator_type)[0]
    if generation in runtimes.NO_TENSORFLOW:
        raise ConfigError(
            f"tpu.accelerator_type {generation}-*: {runtimes.NO_TENSORFLOW[generation]}. This project trains "
            "with TensorFlow: use v5p, v5litepod (v5e) or v4."
        )
    count = hosts(accelerator_type)
    pod = bool(POD_RUNTIME.search(runtime_version))
    if count > 1 and not pod:
        raise ConfigError(
            f"tpu.accelerator_type {accelerator_type} is a pod slice of {count} hosts, but "
            f"tpu.runtime_version {runtime_version!r} is a single-host runtime: TensorFlow on a multi-host "
            f"slice needs the -pod runtime of the same version (e.g. {pod_name(runtime_version)!r}), or pick "
            "a one-host type (v4-8, v5litepod-8, v5p-8)."
        )
    if count == 1 and pod:
        raise ConfigError(
            f"tpu.runtime_version {runtime_version!r} is a -pod runtime, but tpu.accelerator_type "
            f"{accelerator_type} is one host: use the single-host runtime of the same version "
            f"(e.g. {runtime_version.replace('-pod', '')!r}) or a multi-host type (v4-32, v5litepod-16)."
        )
    return count


def pod_name(runtime_version: str) -> str:
    """tpu-vm-tf-2.16.1-pjrt -> tpu-vm-tf-2.16.1-pod-pjrt (Google's naming of the -pod runtimes)."""
    if runtime_version.endswith("-pjrt"):
        return runtime_version[: -len("-pjrt")] + "-pod-pjrt"
    return runtime_version + "-pod"
