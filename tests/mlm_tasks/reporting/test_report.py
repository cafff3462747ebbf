"""The run report (reporting/report.py): real PNG plots, a page that links them, graceful gaps — on a local root and gs://."""

from __future__ import annotations

import io
import json

import pytest
from matplotlib import image as mpimg

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import join
from mlm_tasks.reporting.report import write_report
from peers.run_artifacts import make_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(data: bytes) -> None:
    assert data[:8] == PNG_SIGNATURE
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0.01  # something was drawn, not a blank canvas


@pytest.fixture(params=["local", "gs"])
def output_root(request, tmp_path):
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("gcs_root")


def test_report_has_valid_plots_and_a_page_linking_them(output_root):
    cfg = build_config({"output_root": output_root})
    run = make_run(output_root, "run-1")

    result = write_report(cfg, run)

    for name in ("loss.png", "learning_rate.png"):
        _assert_png(storage.read_bytes(join(run.report, name)))
    page = storage.read_text(join(run.report, "report.md"))
    assert result["report_uri"] == join(run.report, "report.md")
    assert "![Training loss](loss.png)" in page and "![Learning rate](learning_rate.png)" in page
    assert "[../tensorboard/](../tensorboard/)" in page and run.tensorboard in page
    assert "| Masked-token accuracy | 0.3000 |" in page
    assert "| Baseline accuracy (always the most frequent token, `\u2581the`) | 0.0600 |" in page
    assert "Accuracy vs the most-frequent-token baseline: +0.2400" in page
    assert "`The capital of France is <mask>.` → `Paris` (0.410)" in page
    assert "Data fingerprint: `0123456789abcdef`" in page and "Records: train 900, validation 50" in page
    assert "- Steps: 40" in page and "Not available" not in page

    assert json.loads(json.dumps(result)) == result  # fit for XCom
    assert result["eval_loss"] == 4.5 and result["accuracy"] == 0.30 and result["steps"] == 40
    assert result["data_fingerprint"] == "0123456789abcdef" and result["missing"] == []
    assert result["plots"] == {
        "loss": join(run.report, "loss.png"),
        "learning_rate": join(run.report, "learning_rate.png"),
    }


def test_report_names_what_is_missing_instead_of_failing(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    run = make_run(str(tmp_path), "early", metrics=None, predictions=None)

    result = write_report(cfg, run)

    page = storage.read_text(result["report_uri"])
    assert "_No fill-mask predictions were recorded for this run" in page
    assert "_No evaluation metrics were recorded for this run" in page
    assert "## Not available" in page and "- fill-mask predictions (infer/predictions.json)" in page
    assert result["eval_loss"] is None and len(result["missing"]) == 2
    _assert_png(storage.read_bytes(result["plots"]["loss"]))  # training happened, so its curve is there


def test_report_before_training_has_no_plots_and_says_so(tmp_path):
    cfg = build_config({"output_root": str(tmp_path)})
    run = make_run(str(tmp_path), "nothing-yet", metrics=None, predictions=None, history=False, model=False)

    result = write_report(cfg, run)

    page = storage.read_text(result["report_uri"])
    assert result["plots"] == {} and not storage.exists(join(run.report, "loss.png"))
    assert "_No loss curve: no training history yet._" in page
    assert "- training history (train/history.jsonl): no loss curve" in page
    assert "](loss.png)" not in page
