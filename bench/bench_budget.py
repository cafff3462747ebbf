"""Benchmark: does `train.budget_minutes` end on time when the machine gets busier mid-run?

    .venv/bin/python bench/bench_budget.py [--minutes 2] [--load-after 0.4] [--burners 1] [--rounds 1]

Trains the embedded default (configs/default.yaml, the train step users run) for `--minutes`, idle, then
again with `--burners` busy processes started `--load-after` of the way into the budget (a second job
landing on the machine). Prints, per run: the steps planned at the start, the steps trained, the re-plans,
the seconds the budget used (measuring included) and the overrun against the budget; the budget is a
deadline, so the loaded run should train fewer steps and still end within 5% of the budget.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x = (x * 31 + 7) % 1_000_003


def run(minutes: float, load_after: float | None, burners: int, name: str) -> dict:
    from mlm_tasks import storage
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.train import train

    data = common.prepared()
    # train.steps off: the default caps its budget at 3,500 steps, which an idle machine reaches before the deadline.
    cfg = common.bench_config(**{"train.budget_minutes": minutes, "train.steps": None, "train.eval_every": None})
    ctx = RunContext.of(cfg, f"bench-budget-{name}-{time.time_ns()}", data["fingerprint"])
    procs: list[multiprocessing.Process] = []
    if load_after is not None:

        def start_load() -> None:
            time.sleep(load_after * minutes * 60)
            stop_at = time.time() + minutes * 60 * 2
            for _ in range(burners):
                proc = multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True)
                proc.start()
                procs.append(proc)

        threading.Thread(target=start_load, daemon=True).start()
    try:
        train(cfg, ctx)
    finally:
        for proc in procs:
            proc.terminate()
    record = storage.read_json(ctx.run.train_budget)
    return {"run": name, **{k: record[k] for k in ("steps", "trained_steps", "replans", "trained_s", "overrun_s")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=2.0)
    p.add_argument("--load-after", type=float, default=0.4, help="share of the budget before the load starts")
    p.add_argument("--burners", type=int, default=1, help="busy processes (this machine has 2 cores)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    print(common.machine())
    rows = []
    for rnd in range(args.rounds):
        for name, load in (("idle", None), ("loaded", args.load_after)):
            row = run(args.minutes, load, args.burners, name)
            rows.append(row)
            print(
                f"round {rnd + 1} {name:6s}: planned {row['steps']:5d}, trained {row['trained_steps']:5d} steps, "
                f"{row['replans']:4d} re-plans, {row['trained_s']:6.1f} s used of {args.minutes * 60:.0f} "
                f"({row['overrun_s']:+.1f} s, {100 * row['overrun_s'] / (args.minutes * 60):+.1f}%)",
                flush=True,
            )


if __name__ == "__main__":
    main()
