"""bench/bench_checkpoint.py on the tiny preset: both modes save a whole checkpoint and table the times.

TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/bench/test_bench_checkpoint.py -q
"""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # builds a model with a 50k vocabulary and saves it twice: ~15 s
def test_the_bench_saves_sync_and_async_and_tables_both(tmp_path):
    env = {**os.environ, "MLM_BENCH_ROOT": str(tmp_path), "TF_USE_LEGACY_KERAS": "1"}
    script = os.path.join(REPO, "bench", "bench_checkpoint.py")
    done = subprocess.run(
        [sys.executable, script, "--preset", "tiny", "--rounds", "1", "--dir", str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "mode" not in line]
    assert [r[0].strip() for r in rows] == ["sync", "async"]
    for mode in ("sync", "async"):  # each a whole checkpoint: its index and its data
        files = os.listdir(tmp_path / "ckpt" / f"{mode}-0")
        assert "checkpoint" in files and any(f.startswith("ckpt-1.data-") for f in files), files
    assert all(float(r[4]) <= float(r[5]) for r in rows)  # training waits no longer than the write takes
