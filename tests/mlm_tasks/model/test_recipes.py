"""The quality knobs bench/bench_quality.py measures: the precision `auto` picks by the device and the CPU's flags,
the one-cycle schedule, more masking with more prediction slots, a vocabulary padded to a multiple.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/model/test_recipes.py -q
"""

import math

import pytest

from mlm_tasks.errors import ConfigError
from mlm_tasks.model.roberta import model_vocab_size, optimizer_and_schedule
from mlm_tasks.paths import RunContext
from mlm_tasks.training.hooks import FailAtStep
from mlm_tasks.training.plan import auto_precision
from peers.tiny_data import tiny_config


def test_auto_precision_is_bf16_on_accelerators_and_on_cpus_with_bf16_units_and_fp32_elsewhere():
    from mlm_tasks.model.cpu_peak import cpu_info

    assert auto_precision("tpu")[0] == auto_precision("gpu")[0] == "bf16"
    amx, avx512 = auto_precision("cpu", {"avx2", "avx512f", "amx_bf16"}), auto_precision("cpu", {"avx512_bf16"})
    assert (amx[0], avx512[0]) == ("bf16", "bf16") and "(amx_bf16)" in amx[1]
    avx2 = auto_precision("cpu", {"avx2", "fma", "avx512f"})  # AVX-512 without bf16 units: emulated
    assert avx2[0] == "off" and avx2[1].startswith("fp32: this CPU has no bf16 units")
    here = {"amx_bf16", "avx512_bf16"} & cpu_info()["flags"]
    assert auto_precision("cpu")[0] == ("bf16" if here else "off")  # this machine's flags, read from /proc/cpuinfo


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
