"""What a TPU slice costs, for the estimates a run prints: Google's list prices per chip-hour, unless
`tpu.price_per_chip_hour` gives the deployment's own.

    hourly(cfg.tpu)          # $/hour of the run's slice (Spot or on-demand, per tpu.spot)
    cost(cfg.tpu, seconds)   # what that long costs; source(cfg.tpu) names the price it used
"""

from __future__ import annotations

from typing import Any

from mlm_tasks.tpu import slices

PRICES_AS_OF = "2025-11"
# generation -> US$ per chip-hour where it first shipped (v4: us-central2; v5e: us-west4/us-central1; v5p: us-east5)
LIST_PRICES: dict[str, dict[str, float]] = {
    "v4": {"on_demand": 3.22, "spot": 0.97},
    "v5litepod": {"on_demand": 1.20, "spot": 0.48},
    "v5p": {"on_demand": 4.20, "spot": 1.68},
}
ASSUMED_MFU = 0.30  # what a plan assumes before a run measured its own (ModernBERT reports 26-31%)


def chips(accelerator_type: str) -> int:
    """Chips of a slice: v4/v5p suffixes count TensorCores (2 per chip), v5e (v5litepod) counts chips."""
    generation, size = slices.parse(accelerator_type)
    return size if generation in ("v5litepod", "v6e") else size // 2


def hourly(tpu: Any, spot: bool | None = None) -> float | None:
    """US$ per hour of `tpu`'s slice (a TpuConfig): its chips at its price_per_chip_hour, else the list price."""
    prices = LIST_PRICES.get(slices.parse(tpu.accelerator_type)[0], {})
    price = tpu.price_per_chip_hour or prices.get("spot" if (tpu.spot if spot is None else spot) else "on_demand")
    return float(price) * chips(tpu.accelerator_type) if price is not None else None


def cost(tpu: Any, seconds: float) -> float | None:
    """What `seconds` of the run's slice cost at its price (Spot or on-demand as the run asked)."""
    rate = hourly(tpu)
    return rate * seconds / 3600 if rate is not None else None


def source(tpu: Any) -> str:
    if tpu.price_per_chip_hour is not None:
        return f"tpu.price_per_chip_hour ${tpu.price_per_chip_hour:g}"
    return f"list price {PRICES_AS_OF}, cloud.google.com/tpu/pricing"
