"""What a TPU VM costs: list prices per chip-hour, and the estimate a run prints before it spends.

    hourly(cfg.tpu)                          # $/hour of the run's slice (Spot or on-demand, per tpu.spot)
    vm_bill(cfg.tpu, name, created_s, gone_s)   # what the VM cost from its createTime until it was gone
    run_bill(earlier, vm)                    # the run's bill (runs/<run>/tpu_vm.json) with one more VM in it
    bill_lines(bill) / bill_text(bill)       # that bill in the report and card (Markdown) / the summary (a line)
    estimate_lines(cfg, steps, per_token, replicas=4)   # tokens, steps, hours at ASSUMED_MFU, on-demand and Spot

LIST_PRICES are Google's public list prices in US dollars per chip-hour for the regions where each
generation first shipped (v4: us-central2; v5e: us-west4/us-central1; v5p: us-east5), as listed on
https://cloud.google.com/tpu/pricing (read 2025-11; Spot prices move with demand). They are an
estimate, not a bill: regions, committed-use discounts and negotiated prices differ, so a deployment
with other prices sets `tpu.price_per_chip_hour` (what its invoice says) and every figure follows it.
"""

from __future__ import annotations

import time
from typing import Any

from mlm_tasks.tpu import slices

PRICES_AS_OF = "2025-11"
LIST_PRICES: dict[str, dict[str, float]] = {  # generation -> {"on_demand", "spot"} US$ per chip-hour
    "v4": {"on_demand": 3.22, "spot": 0.97},
    "v5litepod": {"on_demand": 1.20, "spot": 0.48},
    "v5p": {"on_demand": 4.20, "spot": 1.68},
}
ASSUMED_MFU = 0.30  # what a plan assumes before a run measured its own (ModernBERT reports 26-31%)


def chips(accelerator_type: str) -> int:
    """Chips of a slice: v4/v5p suffixes count TensorCores (2 per chip), v5e (v5litepod) counts chips."""
    generation, size = slices.parse(accelerator_type)
    return size if generation in ("v5litepod", "v6e") else size // 2


def per_chip_hour(tpu: Any, spot: bool | None = None) -> float | None:
    """US$ per chip-hour of `tpu` (a TpuConfig): its price_per_chip_hour, else the list price."""
    if tpu.price_per_chip_hour is not None:
        return float(tpu.price_per_chip_hour)
    generation = slices.parse(tpu.accelerator_type)[0]
    prices = LIST_PRICES.get(generation)
    if prices is None:
        return None
    return prices["spot" if (tpu.spot if spot is None else spot) else "on_demand"]


def hourly(tpu: Any, spot: bool | None = None) -> float | None:
    price = per_chip_hour(tpu, spot)
    return price * chips(tpu.accelerator_type) if price is not None else None


def cost(tpu: Any, seconds: float) -> float | None:
    """What `seconds` of the run's slice cost at its price (Spot or on-demand as the run asked)."""
    rate = hourly(tpu)
    return rate * seconds / 3600 if rate is not None else None


def source(tpu: Any) -> str:
    if tpu.price_per_chip_hour is not None:
        return f"tpu.price_per_chip_hour ${tpu.price_per_chip_hour:g}"
    return f"list price {PRICES_AS_OF}, cloud.google.com/tpu/pricing"


def utc_stamp(seconds: float) -> str:
    """A bill's time: ISO 8601 UTC to the second (a VM's createTime is matched by it)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def vm_bill(tpu: Any, name: str, created_s: float, gone_s: float, ended: str = "deleted") -> dict[str, Any]:
    """A TPU VM of the run from its createTime until the API no longer knew it (or the run saw it dead:
    `ended` says which, e.g. "PREEMPTED, replaced"): the hours Google bills (VM start, training and the
    steps around it, deletion) and their cost at the run's price. For a node found dead it is an upper
    bound: the API does not say when it stopped."""
    hours = max(0.0, gone_s - created_s) / 3600
    rate = hourly(tpu)
    return {
        "node": name,
        "accelerator_type": tpu.accelerator_type,
        "chips": chips(tpu.accelerator_type),
        "spot": bool(tpu.spot),
        "created": utc_stamp(created_s),
        "gone": utc_stamp(gone_s),
        "hours": hours,
        "cost_usd": rate * hours if rate is not None else None,
        "cost_basis": f"{tpu.accelerator_type} {'Spot' if tpu.spot else 'on-demand'}, {source(tpu)}",
        "ended": ended,
    }


def run_bill(earlier: dict[str, Any] | None, vm: dict[str, Any]) -> dict[str, Any]:
    """The run's bill with `vm` added: every VM the run had (each replaced node, each try's), one entry
    per node and createTime, so a retried deletion counts its VM once; the totals are over all of them
    (no total cost when any VM had no known price). The last VM's fields stay at the top, as a one-VM
    bill has them. `earlier` is the file's content, or None."""
    vms = list((earlier or {}).get("vms") or ([earlier] if earlier and "node" in earlier else []))
    vms = [v for v in vms if (v["node"], v["created"]) != (vm["node"], vm["created"])] + [vm]
    costs = [v.get("cost_usd") for v in vms]
    return {
        **vm,
        "vms": vms,
        "hours": sum(v["hours"] for v in vms),
        "cost_usd": None if None in costs else sum(costs),
    }


def bill_line(bill: dict[str, Any]) -> str:
    """The log line of one VM's bill (vm_bill), or of the run's (run_bill): the last VM, then the run's
    total when it had more than one."""
    vm = (bill.get("vms") or [bill])[-1]
    line = (
        f"TPU VM {vm['node']} was up {vm['hours']:.2f} h ({vm['created']} to {vm['gone']}): {_usd(vm['cost_usd'])} "
        f"({vm['cost_basis']})"
    )
    if len(bill.get("vms") or []) > 1:
        line += f"; the run's {len(bill['vms'])} TPU VMs: {bill['hours']:.2f} h, {_usd(bill['cost_usd'])}"
    return line


def bill_complete(bill: dict[str, Any]) -> bool:
    """Whether the bill holds the run's last VM: delete_tpu_vm (the teardown) adds it once the API no longer
    knows the node (or create_tpu_vm, a node that failed to become READY); until then it holds only the
    nodes the run replaced (the report and the card may be written while the last VM is being deleted)."""
    return str((bill.get("vms") or [bill])[-1].get("ended", "")).endswith("deleted")


def _so_far(bill: dict[str, Any]) -> str:
    return "" if bill_complete(bill) else " so far (the VM still up is added when delete_tpu_vm deletes it)"


def bill_text(bill: dict[str, Any]) -> str:
    """The run's bill in one line (summary.txt): every VM, its hours and how it ended, and the total."""
    vms = bill.get("vms") or [bill]
    each = "; ".join(f"{v['node']} {v['hours']:.2f} h, {v['ended']}" for v in vms)
    rest = _so_far(bill)
    return (
        f"{len(vms)} TPU VM{'s' if len(vms) > 1 else ''} up {bill['hours']:.2f} h = {_usd(bill['cost_usd'])}{rest} "
        f"({vms[-1]['cost_basis']}): {each}"
    )


def bill_lines(bill: dict[str, Any] | None) -> list[str]:
    """The run's bill as Markdown list lines (report.md and the model card): the total over every VM the run
    had, then one line per VM; none without a bill (a CPU run)."""
    if not bill:
        return []
    vms = bill.get("vms") or [bill]
    rest = _so_far(bill)
    return [
        f"- TPU VMs: {len(vms)}, up {bill['hours']:.2f} h in all, {_usd(bill['cost_usd'])}{rest} "
        f"({vms[-1]['cost_basis']})",
        *(
            f"  - `{v['node']}` ({v['accelerator_type']}, {'Spot' if v['spot'] else 'on-demand'}): "
            f"{v['created']} to {v['gone']}, {v['hours']:.2f} h, {_usd(v['cost_usd'])}, {v['ended']}"
            for v in vms
        ),
    ]


def _usd(amount: float | None) -> str:
    return f"${amount:,.2f}" if amount is not None else "no price known"
