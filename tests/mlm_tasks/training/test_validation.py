"""Validation during training (train.eval_every): fixed 15% masks, in the history and TensorBoard, the
best step recorded, and train.keep_checkpoint=best keeping that step's model.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/training/test_validation.py -q
"""

import glob

import pytest

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.training.progress import best_so_far, read_history
from peers.tiny_data import tiny_config

VALIDATED = {
    "train.steps": 24,
    "train.eval_every": 4,
    "train.eval_batches": 2,
    "eval.batch_size": 16,
    "train.log_every": 100,
}


def _batches(cfg, shard_set):
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.training.validation import validation_batches

    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    return [{k: v.numpy().tolist() for k, v in b.items()} for b in validation_batches(shard_set, tokenizer, cfg)]


def test_validation_masks_are_fixed_at_15_percent_whatever_the_run_trains_with(tiny_prepared):
    from mlm_tasks.data.shard_set import load_manifest

    cfg, data = tiny_prepared
    shard_set = load_manifest(cfg, data["fingerprint"])
    at_15 = _batches(tiny_config(cfg.output_root, **VALIDATED), shard_set)
    at_30 = _batches(tiny_config(cfg.output_root, **VALIDATED, **{"train.mlm_probability": 0.3}), shard_set)
    assert len(at_15) == 2 and at_15 == at_30  # the same positions, the same replacements
    masked = sum(label != -100 for b in at_15 for row in b["labels"] for label in row)
    tokens = sum(len(row) for b in at_15 for row in b["labels"])
    assert 0.10 < masked / tokens < 0.20


def test_eval_every_records_the_validation_loss_and_the_best_step(tiny_prepared):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    cfg = tiny_config(cfg.output_root, **VALIDATED)
    summary = train(cfg, RunContext.of(cfg, "validated", data["fingerprint"]))
    run = RunPaths(cfg.output_root, "validated")
    history = read_history(run)
    assert [h["step"] for h in history if "val_loss" in h] == [4, 8, 12, 16, 20, 24]
    assert all("loss" in h for h in history)  # a validation step's entry is a full progress entry
    best_step, best_loss = best_so_far(history)
    assert (summary["best_step"], summary["best_val_loss"]) == (best_step, best_loss)
    assert summary["val_loss"] == history[-1]["val_loss"] and summary["kept"] == "last"
    events = glob.glob(storage.local_path(run.tensorboard) + "/**/events.out.tfevents.*", recursive=True)
    tags = set()
    import tensorflow as tf

    for path in events:
        for event in tf.compat.v1.train.summary_iterator(path):
            tags |= {value.tag for value in event.summary.value}
    assert {"val/loss", "val/accuracy", "train/loss", "train/grad_norm"} <= tags


@pytest.mark.slow  # trains, then evaluates: ~12 s: in make test, not in make test-fast
def test_keep_best_saves_the_best_steps_model_which_evaluate_scores_the_same(tiny_prepared):
    """A learning rate that blows up late: the best validation loss is early, the last far worse. The
    saved model is the best step's: evaluate, on the same first batches, gives its validation loss."""
    from mlm_tasks.steps.evaluate import evaluate
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    cfg = tiny_config(
        cfg.output_root,
        **VALIDATED,
        **{
            "train.learning_rate": 0.9,
            "train.warmup_fraction": 0.95,
            "train.keep_checkpoint": "best",
            "eval.max_batches": 2,
        },
    )
    summary = train(cfg, RunContext.of(cfg, "keep-best", data["fingerprint"]))
    assert summary["kept"] == "best" and summary["best_step"] < cfg.train.steps
    assert summary["val_loss"] > summary["best_val_loss"] + 1.0  # the last step is clearly worse
    metrics = evaluate(cfg, RunContext.of(cfg, "keep-best", data["fingerprint"]))
    # Validation runs in the training's precision, evaluate in fp32 (the saved model): bf16 (auto, on a CPU
    # with bf16 units) rounds the activations to 8 bits of mantissa.
    rel = 1e-4 if summary["precision"] == "off" else 2e-3
    assert metrics["loss"] == pytest.approx(summary["best_val_loss"], rel=rel)


def test_keep_best_needs_eval_every(tmp_path):
    with pytest.raises(ConfigError, match="keep_checkpoint=best needs train.eval_every"):
        tiny_config(tmp_path, **{"train.keep_checkpoint": "best"})
