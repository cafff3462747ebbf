"""Hooks of the training loop: checkpoint listeners such as the Hub sync, a test's fault. docs/operations.md

train(cfg, ctx, hooks=[FailAtStep(6)])                        # in this process (a test)
MLM_TRAIN_HOOKS=mlm_tasks.training.hooks:fail_at_step=6     # a trainer in another process (its environment)
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunPaths

log = logging.getLogger("mlm_tasks.steps.train")
ENV = "MLM_TRAIN_HOOKS"


class TrainHook:
    """Called by the training loop; every method does nothing until a hook overrides it."""

    checkpoint_every: int | None = None  # steps between the extra checkpoints this hook asks for (None: none)

    def on_start(self, run: RunPaths, start_step: int, total_steps: int) -> None:
        """Before the first step of this try (`start_step`: the step it resumes from, 0 for a fresh run)."""

    def on_steps(self, first: int, last: int) -> None:
        """After the call of the compiled loop that ran steps first..last; raising fails the try."""

    def on_checkpoint(self, step: int, path: str) -> None:
        """After a checkpoint was saved (`path`: its prefix, e.g. .../checkpoints/ckpt-40)."""

    def on_end(self) -> None:
        """After the final checkpoint, before the model is saved."""


class CheckpointCallback(TrainHook):
    """An `on_checkpoint(step, path)` callable (and its `checkpoint_every`, if any) as a hook; `end` runs at on_end."""

    def __init__(self, callback: Callable[[int, str], None], end: Callable[[], object] | None = None):
        self.callback, self.end = callback, end
        self.checkpoint_every = getattr(callback, "checkpoint_every", None)

    def on_checkpoint(self, step: int, path: str) -> None:
        self.callback(step, path)

    def on_end(self) -> None:
        if self.end is not None:
            self.end()


class FailAtStep(TrainHook):
    """Fail the try after the call of the loop that holds `step`, once per run (RunPaths.fault_marker records
    it, so the retry resumes and finishes). `run_id`: only that run."""

    def __init__(self, step: int, run_id: str | None = None):
        if step < 1:
            raise ConfigError(f"FailAtStep needs a step of at least 1, not {step}.")
        self.step, self.run_id = step, run_id
        self.marker: str | None = None  # set by on_start when this run is the one to fail

    def __repr__(self) -> str:
        return f"FailAtStep({self.step}" + (f", run_id={self.run_id!r})" if self.run_id else ")")

    def on_start(self, run: RunPaths, start_step: int, total_steps: int) -> None:
        if self.run_id is None or run.run_id == self.run_id:
            self.marker = run.fault_marker

    def on_steps(self, first: int, last: int) -> None:
        if self.marker is None or not first <= self.step <= last or storage.exists(self.marker):
            return
        storage.write_text(self.marker, f"fault injected at step {self.step}\n")
        raise RuntimeError(
            f"Injected fault at step {self.step} (FailAtStep hook, raised after step {last}): a "
            "retry resumes from the last checkpoint."
        )


def fail_at_step(argument: str) -> FailAtStep:
    """MLM_TRAIN_HOOKS factory: `fail_at_step=STEP` (every run) or `fail_at_step=STEP@RUN_ID` (that run only)."""
    step, _, run_id = argument.partition("@")
    if not step.strip().isdigit():
        raise ConfigError(f"{ENV}: fail_at_step takes STEP or STEP@RUN_ID (e.g. fail_at_step=6), not {argument!r}.")
    return FailAtStep(int(step), run_id.strip() or None)


def hooks_from_env(environ: Mapping[str, str] = os.environ) -> list[TrainHook]:
    """The hooks MLM_TRAIN_HOOKS names (none when it is unset or empty); a bad entry is a ConfigError."""
    hooks = [_load(entry.strip()) for entry in environ.get(ENV, "").split(",") if entry.strip()]
    for hook in hooks:
        log.warning("%s adds the training hook %r (a test and diagnostic seam; unset it for real runs)", ENV, hook)
    return hooks


def _load(entry: str) -> TrainHook:
    target, has_argument, argument = entry.partition("=")
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise ConfigError(
            f"{ENV} entry {entry!r} is not module:factory or module:factory=ARG (e.g. "
            "mlm_tasks.training.hooks:fail_at_step=6): fix the variable or unset it."
        )
    try:
        factory: Any = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{ENV} entry {entry!r} names no importable factory ({err}): check the module path "
            "(importable by the trainer's Python) and the name after ':'."
        ) from None
    hook = factory(argument) if has_argument else factory()
    if not isinstance(hook, TrainHook):
        raise ConfigError(
            f"{ENV} entry {entry!r} made a {type(hook).__name__}, not a TrainHook "
            "(mlm_tasks/training/hooks.py): name a factory that returns one."
        )
    return hook
