"""Benchmark 6: DagBag parse time of dags/ (no TensorFlow import), and optionally `make run` wall time and RSS.

    .venv/bin/python bench/bench_parse.py [--runs 3] [--make-run]

Each parse runs in a fresh process with a throwaway AIRFLOW_HOME: `import airflow` first (not timed),
then `DagBag(dag_folder='dags')` is timed (examples off) and sys.modules is checked for
tensorflow and transformers. Target: < 1 s. --make-run also runs `make run` (the whole pipeline under
real Airflow, into a temporary OUTPUT_ROOT and AIRFLOW_HOME) and reports the wall time and peak memory
it prints.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


def worker(_: str) -> None:
    import airflow  # noqa: F401  (its import is not what is measured)
    from airflow.dag_processing.dagbag import DagBag

    t0 = time.perf_counter()
    # Airflow 3 dropped include_examples; AIRFLOW__CORE__LOAD_EXAMPLES=False (airflow_env) does its job.
    bag = DagBag(dag_folder=os.path.join(common.REPO, "dags"))
    seconds = time.perf_counter() - t0
    common.emit(
        {
            "seconds": seconds,
            "dags": sorted(bag.dag_ids),
            "import_errors": len(bag.import_errors),
            "tensorflow": "tensorflow" in sys.modules,
            "transformers": "transformers" in sys.modules,
        }
    )


def airflow_env(home: str) -> dict:
    return {
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(common.REPO, "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": os.path.join(common.REPO, "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


def make_run() -> list:
    with tempfile.TemporaryDirectory(prefix="bench-make-run-") as tmp:
        env = {**os.environ, **airflow_env(os.path.join(tmp, "airflow")), "OUTPUT_ROOT": os.path.join(tmp, "out")}
        t0 = time.time()
        proc = subprocess.run(["make", "run"], cwd=common.REPO, env=env, capture_output=True, text=True)
        wall = time.time() - t0
    found = re.search(r"Wall time\s+(\d+) s; peak memory (\d+) MiB", proc.stdout)
    return [proc.returncode, wall, found.group(2) if found else "?"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--make-run", action="store_true")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-airflow-home-") as home:
            results.append(common.run_worker(__file__, "parse", env=airflow_env(home)))
    print(f"\n{common.machine()}\n")
    print(
        common.table(
            ["run", "DagBag parse s", "DAGs", "import errors", "tensorflow imported", "transformers imported"],
            [
                [i + 1, r["seconds"], " ".join(r["dags"]), r["import_errors"], r["tensorflow"], r["transformers"]]
                for i, r in enumerate(results)
            ],
        )
    )
    print(f"\nmedian {common.median([r['seconds'] for r in results]):.3f} s; target < 1 s, no TensorFlow")
    if args.make_run:
        print()
        print(common.table(["make run exit", "wall s", "peak RSS MiB (largest process)"], [make_run()]))


if __name__ == "__main__":
    main()
