"""train.steps_per_call: K optimizer steps in one compiled call give the same per-step losses as one
step per call, with XLA on and off; a fault and the resume after it keep them exact.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/steps/test_steps_per_call.py -q
"""

import pytest

from mlm_tasks.paths import RunContext, RunPaths
from mlm_tasks.training.hooks import FailAtStep
from mlm_tasks.training.plan import crossed
from mlm_tasks.training.progress import read_history
from peers.tiny_data import tiny_config

STEPS = 16


def _losses(cfg, data, run_id, hooks=(), **settings):
    from mlm_tasks.steps.train import train

    cfg = tiny_config(
        cfg.output_root,
        **{"train.steps": STEPS, "train.log_every": 1, "train.checkpoint_every": 4, "train.device": "cpu", **settings},
    )
    ctx = RunContext.of(cfg, run_id, data["fingerprint"])
    try:
        summary = train(cfg, ctx, hooks=hooks)
    except RuntimeError as err:  # a FailAtStep hook: the first try fails, as a task's would; the retry resumes
        assert "Injected fault" in str(err)
        summary = train(cfg, ctx, hooks=hooks)  # the same hooks, as a task's retry has: the fault fired once
    history = read_history(RunPaths(cfg.output_root, run_id))
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    return [h["loss"] for h in history], summary


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
@pytest.mark.parametrize("xla", ["off", "on"])
def test_eight_steps_per_call_give_the_losses_of_one(tiny_prepared, xla):
    cfg, data = tiny_prepared
    one, summary_one = _losses(cfg, data, f"k1-xla-{xla}", **{"train.steps_per_call": 1, "train.xla": xla})
    eight, summary_eight = _losses(cfg, data, f"k8-xla-{xla}", **{"train.steps_per_call": 8, "train.xla": xla})
    assert (summary_one["steps_per_call"], summary_eight["steps_per_call"]) == (1, 8)
    assert eight == pytest.approx(one, rel=1e-6, abs=1e-6)


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_a_fault_mid_call_resumes_exactly_with_several_steps_per_call(tiny_prepared):
    """The fault of step 6 is raised after the call ending at step 8 (checkpoint at 8); the retry
    resumes there and skips the batches it consumed: the losses are an undisturbed run's."""
    cfg, data = tiny_prepared
    undisturbed, _ = _losses(cfg, data, "k4-undisturbed", **{"train.steps_per_call": 4})
    faulted, summary = _losses(cfg, data, "k4-faulted", [FailAtStep(6)], **{"train.steps_per_call": 4})
    assert summary["resumed_from_step"] == 8
    assert faulted == pytest.approx(undisturbed, rel=1e-6, abs=1e-6)


def test_crossed_finds_a_multiple_inside_a_call():
    assert crossed(4, 1, 4) and crossed(4, 3, 6) and not crossed(4, 5, 7) and crossed(5, 5, 5)
    assert not crossed(0, 1, 100)  # 0: never (no validation)
