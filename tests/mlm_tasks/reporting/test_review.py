"""The review page a person approves a release from (mlm_tasks/reporting/review.py), built from a
run's artifacts on disk and the metrics last published to the repo."""

from __future__ import annotations

import math

from mlm_tasks import paths, storage
from mlm_tasks.config import load_config
from mlm_tasks.paths import RunContext
from mlm_tasks.reporting.review import review_markdown

REPO = "ml-team/roberta-wiki"
METRICS = {
    "split": "validation",
    "loss": 5.1234,
    "perplexity": math.exp(5.1234),
    "accuracy": 0.2468,
    "masked_tokens": 640,
    "untrained_loss": 6.9,
    "untrained_accuracy": 0.001,
    "baseline_accuracy": 0.0612,
    "baseline_token": "the",
}
SUMMARY = {"steps": 12, "val_loss": 5.2, "best_step": 8, "best_val_loss": 5.15, "kept": "last"}
DECISION = {"passed": True, "reasons": ["eval loss 5.1234 is not worse than the previously published 5.3000."]}


def _run(tmp_path, **publish):
    cfg = load_config(
        "configs/tiny.yaml",
        {"output_root": str(tmp_path), "publish.repo_id": REPO, **{f"publish.{k}": v for k, v in publish.items()}},
    )
    return cfg, RunContext.of(cfg, "weekly-2026-03-02").run


def test_the_page_shows_metrics_baselines_gate_published_model_and_validation(tmp_path):
    cfg, run = _run(tmp_path, approval_timeout_hours=24)
    storage.write_json(run.eval_metrics, METRICS)
    storage.write_json(run.train_summary, SUMMARY)
    storage.write_json(
        paths.published_metrics(cfg.output_root, REPO),
        {
            "loss": 5.3,
            "perplexity": math.exp(5.3),
            "accuracy": 0.21,
            "run_id": "weekly-2026-02-23",
            "commit_oid": "abc123",
        },
    )
    page = review_markdown(cfg, run, DECISION)

    assert f"The model of run `weekly-2026-03-02` would be pushed to `{REPO}`, a private repo." in page
    # This run, the untrained model, the unigram baseline, the last published model: one row per metric.
    assert "| loss | 5.1234 | 6.9000 | – | 5.3000 |" in page
    assert f"| perplexity | {math.exp(5.1234):.4f} | {math.exp(6.9):.4f} | – | {math.exp(5.3):.4f} |" in page
    assert "| masked-token accuracy | 0.2468 | 0.0010 | 0.0612 | 0.2100 |" in page
    assert "### Gate: passed\n- eval loss 5.1234 is not worse than the previously published 5.3000." in page
    assert "run `weekly-2026-02-23`, commit `abc123`" in page
    assert "- best: 5.1500 at step 8\n- last: 5.2000" in page
    assert "_No downstream evaluation was recorded for this run" in page
    assert "No answer within 24 h (`publish.approval_timeout_hours`) counts as a rejection." in page


def test_a_first_release_and_a_run_without_validation_say_so(tmp_path):
    cfg, run = _run(tmp_path, private=False)
    storage.write_json(run.eval_metrics, METRICS)
    storage.write_json(run.train_summary, {**SUMMARY, "val_loss": None, "best_step": None, "best_val_loss": None})
    page = review_markdown(cfg, run, {"passed": True, "reasons": ["no previously published model to compare with."]})
    assert "a public repo." in page
    assert f"Nothing published to `{REPO}` from this output_root yet: this would be its first model." in page
    assert "| loss | 5.1234 | 6.9000 | – | – |" in page
    assert "No validation during training (`train.eval_every` is off)." in page


def _page_with(tmp_path, downstream: dict) -> str:
    cfg, run = _run(tmp_path)
    storage.write_json(run.downstream, downstream)
    return review_markdown(cfg, run, DECISION)


def test_downstream_scores_become_a_table(tmp_path):
    """The downstream step's own result (eval/downstream.json), as the card and the report show it."""
    runs = lambda mean, std: {"mean": mean, "std": std, "min": mean, "max": mean, "runs": []}  # noqa: E731
    downstream = {
        "tasks": [
            {
                "name": "sst2",
                "source": "hf_dataset",
                "metric": "accuracy",
                "labels": ["0", "1"],
                "pair": False,
                "examples": {"train": 800, "validation": 200},
                "seeds": [42, 43, 44],
                "budget": {"steps": 100, "batch_size": 16, "learning_rate": 1e-4, "max_length": 64},
                "min_score": None,
                "pretrained": runs(0.81, 0.012),
                "random_init": runs(0.55, 0.0),
            }
        ],
        "skipped": [],
    }
    page = _page_with(tmp_path, downstream)
    assert "| sst2 | accuracy | 0.8100 ± 0.0120 | — | 3 | 0.5500 ± 0.0000 | +0.2600 | 800 train, 200 scored |" in page
    # With the bootstrap's interval and a flag (too few scored examples), as the downstream step writes them.
    downstream["tasks"][0]["pretrained"]["interval"] = [0.7612, 0.8544]
    downstream["tasks"][0]["warnings"] = ["sst2: the 95% interval of accuracy is ±0.139 over 50 scored examples"]
    page = _page_with(tmp_path, downstream)
    assert "| sst2 | accuracy | 0.8100 ± 0.0120 | [0.7612, 0.8544] | 3 |" in page
    assert "- **Warning:** sst2: the 95% interval of accuracy is ±0.139 over 50 scored examples" in page


def test_missing_artifacts_do_not_break_the_page(tmp_path):
    cfg, run = _run(tmp_path)
    page = review_markdown(cfg, run, {"passed": False, "reasons": ["No eval metrics ..."]})
    assert "No eval metrics for this run" in page and "No training summary" in page and "### Gate: failed" in page
