"""The quality knobs bench/bench_quality.py measures: the precision `auto` picks by timing the model on this CPU,
the one-cycle schedule, more masking with more prediction slots, a vocabulary padded to a multiple.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/model/test_recipes.py -q
"""

import math

import pytest

from mlm_tasks import machine_cache
from mlm_tasks.errors import ConfigError
from mlm_tasks.model import precision
from mlm_tasks.model.roberta import model_vocab_size, optimizer_and_schedule
from mlm_tasks.paths import RunContext
from mlm_tasks.training.hooks import FailAtStep
from peers.tiny_data import tiny_config


def test_auto_precision_times_the_model_once_per_machine_and_shape_and_picks_the_faster(tmp_path, monkeypatch):
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path / "precision.json"))
    monkeypatch.setattr(machine_cache, "busy_load", lambda: None)  # a quiet machine: cached
    timed = []

    def measure(which):  # seconds per step: bf16 at half fp32's rate, as TensorFlow ran it on an AVX-512 Xeon
        timed.append(which)
        return {"off": 0.10, "bf16": 0.20}[which]

    first = precision.auto_precision("cpu", "Xeon x 2 | 1L 256H", measure)
    assert first.precision == "off" and timed == ["off", "bf16"]
    assert first.reason.startswith("fp32: 2.00x bf16's steps/s") and "100.0 ms/step fp32, 200.0 bf16" in first.reason
    again = precision.auto_precision("cpu", "Xeon x 2 | 1L 256H", lambda which: pytest.fail("timed again"))
    assert again == first  # cached for this machine kind and shape
    other = precision.auto_precision("cpu", "Xeon x 2 | 2L 256H", lambda which: {"off": 0.3, "bf16": 0.2}[which])
    assert other.precision == "bf16" and other.reason.startswith("bf16: 1.50x fp32's")  # another shape: timed
    tpu = precision.auto_precision("tpu", "any", lambda which: pytest.fail("timed on a TPU"))
    assert tpu.precision == precision.auto_precision("gpu", "any", measure).precision == "bf16"


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_auto_precision_on_this_cpu_times_the_runs_own_model_and_the_summary_says_why(tiny_prepared, monkeypatch):
    from mlm_tasks.steps.train import train

    monkeypatch.setenv(precision.CACHE_ENV, str(tiny_prepared[0].output_root) + "/precision.json")
    cfg, data = tiny_prepared
    auto = tiny_config(cfg.output_root, **{"train.mixed_precision": "auto", "train.steps": 4})
    summary = train(auto, RunContext.of(auto, "auto-precision", data["fingerprint"]))
    assert summary["precision"] in ("off", "bf16")
    assert summary["precision_reason"].startswith({"off": "fp32: ", "bf16": "bf16: "}[summary["precision"]])
    assert "steps/s for this model on this CPU" in summary["precision_reason"]


def test_one_cycle_warms_up_to_the_peak_then_anneals_to_zero_on_the_last_step(tmp_path):
    cfg = tiny_config(
        tmp_path, **{"train.schedule": "one_cycle", "train.learning_rate": 0.003, "train.warmup_fraction": 0.1}
    )
    _, one_cycle = optimizer_and_schedule(cfg.train, 100)
    lr = {step: float(one_cycle(step)) for step in (0, 5, 10, 55, 100)}
    assert lr[0] == 0 and lr[5] == pytest.approx(0.0015) and lr[10] == pytest.approx(0.003)
    assert lr[55] == pytest.approx(0.0015, rel=1e-3) and lr[100] == pytest.approx(0, abs=1e-9)  # cosine
    linear_cfg = tiny_config(tmp_path, **{"train.learning_rate": 0.003, "train.warmup_fraction": 0.1})
    _, linear = optimizer_and_schedule(linear_cfg.train, 100)
    assert float(linear(10)) == pytest.approx(0.003) and float(linear(100)) == pytest.approx(0, abs=1e-9)
    assert float(linear(30)) < float(one_cycle(30))  # the one-cycle stays near its peak longer


def test_validate_refuses_too_few_prediction_slots_too_much_masking_and_padding_a_base_vocabulary(tmp_path):
    assert tiny_config(tmp_path, **{"train.mlm_probability": 0.3, "train.max_predictions_per_seq": 24})
    with pytest.raises(ConfigError, match="raise it to about 28"):  # 30% of 64 tokens: 19 masked on average
        tiny_config(tmp_path, **{"train.mlm_probability": 0.3, "train.max_predictions_per_seq": 16})
    with pytest.raises(ConfigError, match="under half the context"):
        tiny_config(tmp_path, **{"train.mlm_probability": 0.6, "train.max_predictions_per_seq": 0})
    with pytest.raises(ConfigError, match="leave model.vocab_multiple empty"):
        tiny_config(tmp_path, **{"model.vocab_multiple": 128, "model.init_from": "FacebookAI/roberta-base"})
    padded = tiny_config(tmp_path, **{"model.vocab_multiple": 128})
    assert model_vocab_size(padded, 1000) == 1024 and model_vocab_size(padded, 1024) == 1024
    assert model_vocab_size(tiny_config(tmp_path), 1000) == 1000


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_bf16_one_cycle_more_masking_and_a_padded_vocabulary_train_resume_evaluate_and_fill_masks(tiny_prepared):
    """All four knobs in one tiny run: the loss starts near ln(vocab) and falls, a faulted try resumes
    from its padded checkpoint, and evaluate and fill-mask read the padded model with the tokenizer."""
    from mlm_tasks.steps.evaluate import evaluate
    from mlm_tasks.steps.fill_mask import fill_mask
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    knobs = tiny_config(
        cfg.output_root,
        **{
            "train.mixed_precision": "bf16",
            "train.schedule": "one_cycle",
            "train.learning_rate": 0.003,
            "train.mlm_probability": 0.3,
            "train.max_predictions_per_seq": 32,
            "model.vocab_multiple": 128,
            "train.steps": 16,
            "train.eval_every": 8,
            "train.device": "cpu",
        },
    )
    ctx = RunContext.of(knobs, "knobs", data["fingerprint"])
    with pytest.raises(RuntimeError, match="Injected fault"):
        train(knobs, ctx, hooks=[FailAtStep(7)])
    summary = train(knobs, ctx)
    assert summary["precision"] == "bf16" and summary["resumed_from_step"] == 5
    assert abs(summary["first_loss"] - math.log(data["vocab_size"])) < 1.0  # the fp32 head's softmax: sane
    assert math.isfinite(summary["val_loss"]) and summary["last_loss"] < summary["first_loss"]
    import json
    import os

    with open(os.path.join(ctx.run.model, "config.json")) as f:
        assert json.load(f)["vocab_size"] == 1024 == model_vocab_size(knobs, data["vocab_size"])
    metrics = evaluate(knobs, ctx)
    assert math.isfinite(metrics["loss"])
    predictions = fill_mask(knobs, ctx)
    assert all(len(p["predictions"]) == knobs.infer.top_k for p in predictions)
