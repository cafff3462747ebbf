"""bench/bench_gpu.py keeps working without a GPU: its CPU check (tiny preset, a few steps, the tiny
corpus) runs as a subprocess, as a user runs it, and prints every loop's row (ours and the reference on
RoBERTa, ours on ModernBERT) with every column."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _rows(table_lines: list[str]) -> dict[str, dict[str, str]]:
    """The Markdown table's rows by their first cell, each as {column: cell}."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table_lines]
    header, body = cells[0], cells[2:]  # cells[1] is the |---| rule
    return {row[0]: dict(zip(header, row, strict=True)) for row in body}


def _number(cell: str) -> float:
    return float(cell.rstrip("%").replace(",", ""))


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_cpu_check_prints_both_loops_with_throughput_mfu_and_memory(tmp_path):
    env = {**os.environ, "MLM_BENCH_ROOT": str(tmp_path / "bench"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [
            sys.executable,
            "bench/bench_gpu.py",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--steps",
            "6",
            "--batch",
            "8",
            "--config",
            "configs/tiny.yaml",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # three loops, each a fresh TensorFlow process; minutes on a loaded 2-core machine
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    table = [line for line in lines if line.startswith("|")]
    rows = _rows(table)
    assert set(rows) == {"ours", "reference", "modernbert"}, out.stdout
    for name, row in rows.items():
        assert _number(row["tokens/s"]) > 0, (name, row)
        assert row["MFU"].endswith("%") and _number(row["MFU"]) > 0, (name, row)  # the CPU probe is the peak
        assert _number(row["peak RSS MiB"]) > 100, (name, row)  # a TensorFlow process: no GPU, so RSS
        assert _number(row["MFLOP/token"]) > 0, (name, row)
        assert row["steps/call"] == "1", (name, row)  # CPU: train.steps_per_call auto is 1; fit's default
    # The reference computes the LM head at every position, ours at the masked slots only.
    assert _number(rows["reference"]["MFLOP/token"]) > _number(rows["ours"]["MFLOP/token"])
    assert any(
        line.startswith("model.preset tiny") and "XLA on" in line and "the first 2 not timed" in line for line in lines
    ), out.stdout
    assert any(line.startswith("whole command") for line in lines), out.stdout
    assert any(line.startswith("modernbert: ours on ModernBERT's shape of preset tiny") for line in lines), out.stdout
