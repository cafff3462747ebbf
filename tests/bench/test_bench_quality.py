"""bench/bench_quality.py end to end on the tiny config: the default and a candidate alternate in fresh
subprocesses (this checkout's mlm_tasks), each scored on the fixed-mask validation loss, into one table.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/bench/test_bench_quality.py -q
"""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # four tiny trainings in fresh processes: ~1.5 min
def test_the_bench_trains_each_recipe_in_its_own_process_and_tables_the_validation_losses(tmp_path):
    env = {**os.environ, "MLM_BENCH_ROOT": str(tmp_path), "TF_USE_LEGACY_KERAS": "1"}
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_quality.py"), "--config",
                           os.path.join(REPO, "configs", "tiny.yaml"), "--budget-minutes", "0.02",
                           "--candidates", "one_cycle"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and "recipe" not in line}
    assert set(rows) == {"default", "one_cycle"}
    assert rows["default"][4] == "+0.0000" and float(rows["one_cycle"][3]) > 0  # val loss, delta vs default
    assert "round 1 one_cycle:" in done.stderr and f"({os.path.join(REPO, 'mlm_tasks')})" in done.stderr
    # --today: another checkout's code and config as the baseline (here this one, so the data is cached).
    today = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_quality.py"), "--config",
                            os.path.join(REPO, "configs", "tiny.yaml"), "--budget-minutes", "0.02",
                            "--candidates", "mask30", "--today", REPO], env=env, capture_output=True, text=True,
                           timeout=300)
    assert today.returncode == 0, today.stderr[-3000:]
    assert "| vs today " in today.stdout and "round 1 today:" in today.stderr and "round 1 mask30:" in today.stderr
    assert "round 1 default:" not in today.stderr  # the baseline is today's, not this checkout's default
    unknown = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_quality.py"), "--candidates",
                              "bf16+nonsense"], env=env, capture_output=True, text=True, timeout=120)
    assert unknown.returncode != 0 and "Unknown candidate 'nonsense'" in unknown.stderr
