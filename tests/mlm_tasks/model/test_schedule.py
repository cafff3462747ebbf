"""train.schedule: wsd (warmup, a stable phase, a decay of train.decay_fraction in train.decay_shape) and a
decay-only continuation from a stable run's checkpoint (train.continue_run) that trains as the whole
schedule in one run would: the same weights, optimizer state and batches.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/model/test_schedule.py -q
"""

import math

import pytest

from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.training.hooks import FailAtStep
from mlm_tasks.training.progress import read_history
from peers.tiny_data import tiny_config

PEAK = 0.002


def test_wsd_warms_up_holds_the_peak_then_decays_and_a_replan_moves_the_decay_with_the_end(tmp_path):
    from mlm_tasks.model.roberta import optimizer_and_schedule

    settings = {"train.learning_rate": PEAK, "train.warmup_fraction": 0.1, "train.schedule": "wsd"}
    _, wsd = optimizer_and_schedule(tiny_config(tmp_path, **settings).train, 1000)  # 1-sqrt over the last 200
    assert wsd.at(50) == pytest.approx(PEAK / 2) and wsd.at(100) == wsd.at(800) == pytest.approx(PEAK)
    assert wsd.at(900) == pytest.approx(PEAK * (1 - math.sqrt(0.5))) and wsd.at(1000) == pytest.approx(0, abs=1e-9)
    wsd.replan(500, 900)  # a time budget moved the end: the decay is still the last 20%
    assert wsd.at(720) == pytest.approx(PEAK) and wsd.at(810) == pytest.approx(PEAK * (1 - math.sqrt(0.5)))
    before = wsd.at(850)
    wsd.replan(850, 870)  # mid-decay: from this step's rate, no jump
    assert wsd.at(850) == pytest.approx(before) and wsd.at(870) == pytest.approx(0, abs=1e-9)
    shapes = {}
    for shape in ("linear", "cosine", "1-sqrt"):
        cfg = tiny_config(tmp_path, **settings, **{"train.decay_shape": shape, "train.decay_fraction": 0.5})
        shapes[shape] = optimizer_and_schedule(cfg.train, 1000)[1].at(750) / PEAK  # halfway through the decay
    assert shapes == pytest.approx({"linear": 0.5, "cosine": 0.5, "1-sqrt": 1 - math.sqrt(0.5)})
    _, stable = optimizer_and_schedule(tiny_config(tmp_path, **settings, **{"train.decay_fraction": 0}).train, 1000)
    assert stable.at(1000) == pytest.approx(PEAK)  # decay_fraction 0: a stable run, to be continued


def test_the_report_reads_the_phases_off_the_logged_rates_and_draws_them(tmp_path):
    from mlm_tasks.model.roberta import optimizer_and_schedule
    from mlm_tasks.reporting.plots import line_plot, schedule_phases

    steps = list(range(1, 101))
    phases = {}
    for schedule in ("wsd", "linear"):
        cfg = tiny_config(tmp_path, **{"train.schedule": schedule, "train.warmup_fraction": 0.1})
        lrs = [optimizer_and_schedule(cfg.train, 100)[1].at(step) for step in steps]
        phases[schedule] = schedule_phases(steps, lrs)
        png = line_plot(
            {"lr": (steps, lrs)}, "t", "step", "lr", right=("norm", {"norm": (steps, lrs)}), spans=phases[schedule]
        )
        assert png.startswith(b"\x89PNG")
    assert phases == {
        "wsd": {"warmup": (1, 10), "stable": (10, 80), "decay": (80, 100)},
        "linear": {"warmup": (1, 10), "decay": (10, 100)},
    }


def test_wsd_and_continue_run_are_validated(tmp_path):
    with pytest.raises(ConfigError, match="warmup_fraction 0.5 \\+ train.decay_fraction 0.6 is over 1"):
        tiny_config(tmp_path, **{"train.schedule": "wsd", "train.warmup_fraction": 0.5, "train.decay_fraction": 0.6})
    with pytest.raises(ConfigError, match="set one of them"):
        tiny_config(tmp_path, **{"train.continue_run": "stable", "model.init_from": "FacebookAI/roberta-base"})
    with pytest.raises(ConfigError, match="continue_run"):
        tiny_config(tmp_path, **{"train.continue_run": "../elsewhere"})


def _train(cfg, data, run_id, hooks=(), **settings):
    from mlm_tasks.steps.train import train

    cfg = tiny_config(
        cfg.output_root,
        **{
            "train.learning_rate": PEAK,
            "train.log_every": 1,
            "train.schedule": "wsd",
            "train.device": "cpu",
            **settings,
        },
    )
    ctx = RunContext.of(cfg, run_id, data["fingerprint"])
    try:
        summary = train(cfg, ctx, hooks=hooks)
    except RuntimeError as err:  # a FailAtStep hook: the retry resumes from the run's own checkpoint
        assert "Injected fault" in str(err)
        summary = train(cfg, ctx, hooks=hooks)
    return read_history(RunPaths(cfg.output_root, run_id)), summary


@pytest.mark.slow  # trains three models: in make test, not in make test-fast
def test_a_decay_only_continuation_of_a_stable_run_trains_as_one_wsd_run_and_resumes_its_optimizer(tiny_prepared):
    """Stable (8 steps: 2 of warmup, then the peak) + a decay-only run of 8 steps continued from its checkpoint
    = one wsd run of 16 steps with the decay in its second half: the same losses and learning rates, step for
    step, though the continuation is faulted and resumed from its own checkpoint midway."""
    import tensorflow as tf

    cfg, data = tiny_prepared
    whole, _ = _train(
        cfg, data, "wsd-whole", **{"train.steps": 16, "train.warmup_fraction": 0.125, "train.decay_fraction": 0.5}
    )
    stable, _ = _train(
        cfg, data, "wsd-stable", **{"train.steps": 8, "train.warmup_fraction": 0.25, "train.decay_fraction": 0}
    )
    decay_only = {"train.warmup_fraction": 0, "train.decay_fraction": 1, "train.continue_run": "wsd-stable"}
    decay, summary = _train(cfg, data, "wsd-decay", [FailAtStep(6)], **{"train.steps": 8, **decay_only})
    assert summary["resumed_from_step"] == 5
    assert [h["learning_rate"] for h in stable] == pytest.approx([h["learning_rate"] for h in whole[:8]])
    assert [h["learning_rate"] for h in decay] == pytest.approx([h["learning_rate"] for h in whole[8:]], abs=1e-9)
    assert decay[-1]["learning_rate"] == pytest.approx(0, abs=1e-9) and decay[0]["learning_rate"] < PEAK
    assert [h["loss"] for h in stable + decay] == pytest.approx([h["loss"] for h in whole], rel=1e-5)
    from mlm_tasks.reporting.plots import schedule_phases

    steps, rates = [h["step"] for h in whole], [h["learning_rate"] for h in whole]
    assert schedule_phases(steps, rates) == {"warmup": (1, 2), "stable": (2, 8), "decay": (8, 16)}  # the report's
    reader = tf.train.load_checkpoint(RunPaths(cfg.output_root, "wsd-decay").checkpoints)
    assert reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == 16  # the stable run's optimizer, on
    with pytest.raises(MissingArtifactError, match="has no checkpoint"):
        _train(cfg, data, "wsd-orphan", **{"train.steps": 4, "train.continue_run": "never-trained"})


@pytest.mark.slow  # trains two tiny models
def test_a_modernbert_run_is_continued_from_its_checkpoint(tiny_prepared):
    """continue_run finds a ModernBERT checkpoint's word embeddings (its vocabulary), as it finds RoBERTa's."""
    import tensorflow as tf

    from mlm_tasks.training.plan import checkpoint_vocab_size

    cfg, data = tiny_prepared
    modernbert = {"model.architecture": "modernbert", "train.steps": 4}
    _train(cfg, data, "mb-stable", **modernbert, **{"train.warmup_fraction": 0.25, "train.decay_fraction": 0})
    assert checkpoint_vocab_size(RunPaths(cfg.output_root, "mb-stable").checkpoints) == cfg.tokenizer.vocab_size
    decay_only = {"train.warmup_fraction": 0, "train.decay_fraction": 1, "train.continue_run": "mb-stable"}
    decay, _ = _train(cfg, data, "mb-decay", **modernbert, **decay_only)
    assert decay[-1]["learning_rate"] == pytest.approx(0, abs=1e-9) and len(decay) == 4
    reader = tf.train.load_checkpoint(RunPaths(cfg.output_root, "mb-decay").checkpoints)
    assert reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE") == 8  # the stable run's optimizer, on
