"""The training loop's hooks (mlm_tasks/training/hooks.py): FailAtStep fires once per run, and only for its
run; MLM_TRAIN_HOOKS names hooks by import path, and every entry it cannot use is a ConfigError saying why.

    .venv/bin/python -m pytest tests/mlm_tasks/training/test_hooks.py -q
"""

import pytest

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunPaths
from mlm_tasks.training.hooks import CheckpointCallback, FailAtStep, TrainHook, hooks_from_env


def _calls(hook: TrainHook, run: RunPaths, calls: list[tuple[int, int]]) -> None:
    hook.on_start(run, 0, 100)
    for first, last in calls:
        hook.on_steps(first, last)


def test_a_fault_fires_on_the_call_holding_its_step_once_per_run(tmp_path):
    run = RunPaths(str(tmp_path), "r1")
    _calls(FailAtStep(6), run, [(1, 4)])  # before step 6: nothing
    with pytest.raises(RuntimeError, match=r"Injected fault at step 6 \(FailAtStep hook, raised after step 8\)"):
        _calls(FailAtStep(6), run, [(1, 4), (5, 8)])
    assert storage.read_text(run.fault_marker) == "fault injected at step 6\n"
    _calls(FailAtStep(6), run, [(5, 8)])  # the retry, with the same hooks: the marker says it happened


def test_a_fault_for_one_run_leaves_the_others_alone(tmp_path):
    _calls(FailAtStep(2, run_id="the-one"), RunPaths(str(tmp_path), "another"), [(1, 4)])
    with pytest.raises(RuntimeError, match="Injected fault at step 2"):
        _calls(FailAtStep(2, run_id="the-one"), RunPaths(str(tmp_path), "the-one"), [(1, 4)])


def test_the_environment_names_hooks_by_import_path():
    assert hooks_from_env({}) == [] and hooks_from_env({"MLM_TRAIN_HOOKS": " "}) == []
    every, one = hooks_from_env(
        {
            "MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=6, "
            "mlm_tasks.training.hooks:fail_at_step=3@rest-fault"
        }
    )
    assert (every.step, every.run_id, one.step, one.run_id) == (6, None, 3, "rest-fault")


@pytest.mark.parametrize(
    "value, message",
    [
        ("fail_at_step=6", "is not module:factory or module:factory=ARG"),
        ("no_such_package.hooks:fail_at_step=6", "names no importable factory"),
        ("mlm_tasks.training.hooks:no_such_factory", "names no importable factory"),
        ("mlm_tasks.training.hooks:fail_at_step=six", "fail_at_step takes STEP or STEP@RUN_ID"),
        ("mlm_tasks.training.hooks:fail_at_step=0", "at least 1"),
        ("mlm_tasks.paths:RunContext=out", "made a RunContext, not a TrainHook"),
    ],
)
def test_an_entry_that_makes_no_hook_is_a_config_error(value, message):
    with pytest.raises(ConfigError, match=message):
        hooks_from_env({"MLM_TRAIN_HOOKS": value})


def test_a_checkpoint_callable_keeps_its_cadence_and_ends():
    seen = []

    def callback(step, path):
        seen.append((step, path))

    callback.checkpoint_every = 7
    hook = CheckpointCallback(callback, end=lambda: seen.append("end"))
    hook.on_checkpoint(7, "ckpt-7")
    hook.on_end()
    assert hook.checkpoint_every == 7 and seen == [(7, "ckpt-7"), "end"]
