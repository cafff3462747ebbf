"""Every run under an output_root in one table (mlm_tasks/reporting/compare.py): the `compare` verb and the
run report's section, with validation loss against tokens seen.

    .venv/bin/python -m pytest tests/mlm_tasks/reporting/test_compare.py -q
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from matplotlib import image as mpimg

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import RunContext, RunPaths, join
from mlm_tasks.reporting.compare import compare_runs, table_lines, val_loss_plot
from mlm_tasks.steps.report import report
from peers.run_artifacts import DATA_INFO, make_run

ROOT = Path(__file__).resolve().parents[3]


def _validated_run(
    root: str,
    name: str,
    *,
    batch: int,
    val: list[float],
    base: str | None = None,
    downstream: dict[str, float] | None = None,
) -> RunPaths:
    """A finished run whose history validated every 10 steps, trained at global batch `batch`."""
    run = make_run(root, name, steps=len(val) * 10)
    history = [json.loads(line) for line in storage.read_text(run.train_history).splitlines()]
    for row in history:
        if row["step"] % 10 == 0:
            row["val_loss"] = val[row["step"] // 10 - 1]
    storage.write_text(run.train_history, "".join(json.dumps(r) + "\n" for r in history))
    summary = storage.read_json(run.train_summary)
    best = min(range(len(val)), key=val.__getitem__)
    summary.update(
        global_batch=batch,
        data_fingerprint="0123456789abcdef",
        val_loss=val[-1],
        best_val_loss=val[best],
        best_step=(best + 1) * 10,
        elapsed_s=90.0,
    )
    storage.write_json(run.train_summary, summary)
    if base:
        storage.write_json(run.data_ref, {**DATA_INFO, "base_model": {"init_from": base, "revision": "abc"}})
    if downstream:
        tasks = [
            {"name": t, "metric": "accuracy", "pretrained": {"mean": m, "std": 0.01}} for t, m in downstream.items()
        ]
        storage.write_json(run.downstream, {"tasks": tasks, "skipped": []})
    return run


def _png_ok(data: bytes) -> None:
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.std() > 0.01


def test_rows_hold_what_each_run_recorded_on_one_tokens_axis(tmp_path):
    root = str(tmp_path)
    _validated_run(root, "a-scratch", batch=8, val=[6.0, 5.5, 5.2])
    _validated_run(
        root, "b-continued", batch=16, val=[4.0, 3.9, 4.1], base="org/base", downstream={"same_article": 0.71}
    )
    make_run(root, "c-training", history=False)  # no summary yet: still training, left out
    rows = compare_runs(root)
    assert [r["run"] for r in rows] == ["a-scratch", "b-continued"]
    a, b = rows
    assert (a["steps"], a["tokens"], a["base_model"], a["downstream"]) == (30, 30 * 8 * 128, None, {})
    assert (b["tokens"], b["base_model"], b["best_val_loss"], b["best_step"], b["val_loss"]) == (
        30 * 16 * 128,
        "org/base",
        3.9,
        20,
        4.1,
    )
    assert b["downstream"] == {"same_article": 0.71} and b["eval_loss"] == 4.5
    assert b["val_curve"] == [[10 * 16 * 128, 4.0], [20 * 16 * 128, 3.9], [30 * 16 * 128, 4.1]]

    head, _, *lines = table_lines(rows, current="b-continued")
    assert head.split(" | ")[-3:] == ["same_article", "wall time", "cost |"]
    assert lines[0].startswith("| a-scratch | `0123456789abcdef` | random init | 30 | 30,720 | 5.2000 | 5.2000 @ 30")
    assert lines[1].startswith("| **b-continued** |") and "`org/base`" in lines[1] and "| 0.710 |" in lines[1]
    assert lines[0].endswith("| — | 1.5 min | — |")  # no downstream score, no cost recorded
    _png_ok(val_loss_plot(rows))


def test_the_compare_verb_writes_the_table_and_the_plot_and_names_unknown_runs(tmp_path):
    root = str(tmp_path / "out")
    _validated_run(root, "r1", batch=8, val=[6.0, 5.0])
    _validated_run(root, "r2", batch=8, val=[5.8, 4.9])
    cli = [
        sys.executable,
        "-m",
        "mlm_tasks",
        "compare",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--set",
        f"output_root={root}",
    ]
    done = subprocess.run([*cli, "--runs", "r2"], capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(done.stdout)
    assert [r["run"] for r in result["rows"]] == ["r2"]
    assert "| r2 |" in storage.read_text(result["table"]) and "r1" not in storage.read_text(result["table"])
    _png_ok(storage.read_bytes(result["plot"]))
    missing = subprocess.run([*cli, "--runs", "r2,nope"], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and "No finished training for run(s) nope" in missing.stderr
    assert "the runs there are r1, r2" in missing.stderr


def test_the_report_shows_this_run_among_the_others(tmp_path):
    """Airflow's run ids hold ':' and '+': their folders are hashed (safe_run_id), and found by listing."""
    root, run_id = str(tmp_path), "manual__2026-12-01T15:45:05.616518+00:00"
    _validated_run(root, "earlier", batch=8, val=[6.0, 5.6])
    this = _validated_run(root, run_id, batch=8, val=[5.9, 5.1])
    folder = this.root.rsplit("/", 1)[-1]
    assert folder != run_id and [r["run"] for r in compare_runs(root)] == ["earlier", folder]
    result = report(build_config({"output_root": root}), RunContext(root, run_id))
    page = storage.read_text(join(this.report, "report.md"))
    section = page.split("## All runs under output_root", 1)[1]
    assert "| earlier |" in section and f"| **{folder}** |" in section
    assert "![Validation loss against tokens seen](runs_val_loss.png)" in section
    _png_ok(storage.read_bytes(result["plots"]["runs_val_loss"]))
