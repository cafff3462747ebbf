"""bench/bench_quality.py end to end on the tiny config: today's baseline and a candidate alternate in
fresh subprocesses (this checkout's mlm_tasks), each scored on the fixed-mask validation loss, into one
table. (`default` would be a third training of the same recipe as `today` here: it adds time, not a check.)

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/bench/test_bench_quality.py -q
"""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # two tiny trainings in fresh processes: ~1 min
def test_the_bench_trains_each_recipe_in_its_own_process_and_tables_the_validation_losses(tmp_path):
    env = {**os.environ, "MLM_BENCH_ROOT": str(tmp_path), "TF_USE_LEGACY_KERAS": "1"}
    # --today: another checkout's code and config as the baseline (here this one: its recipe `default` is
    # the same code, run under the name `today`); a candidate beside it.
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "bench", "bench_quality.py"),
            "--config",
            os.path.join(REPO, "configs", "tiny.yaml"),
            "--budget-minutes",
            "0.02",
            "--candidates",
            "one_cycle",
            "--today",
            REPO,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and "recipe" not in line
    }
    assert list(rows) == ["today", "one_cycle"]
    assert "| vs today " in done.stdout and rows["today"][4] == "+0.0000"  # the deltas are against today's
    assert float(rows["one_cycle"][3]) > 0 and float(rows["today"][3]) > 0  # val loss
    for name in rows:  # each in its own process, on this checkout's mlm_tasks (today's through PYTHONPATH)
        assert f"round 1 {name}:" in done.stderr
    assert f"({os.path.join(REPO, 'mlm_tasks')})" in done.stderr
    unknown = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "bench_quality.py"), "--candidates", "bf16+nonsense"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode != 0 and "Unknown candidate 'nonsense'" in unknown.stderr
