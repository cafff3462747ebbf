"""Hooks of the training loop: what a caller runs around it (checkpoint listeners such as the Hub sync, a
test's fault) without the loop knowing who they are.

    train(cfg, ctx, hooks=[FailAtStep(6)])                        # in this process (a test)

A hook overrides what it needs of `TrainHook`: `on_start(run, start_step, total_steps)` before the first
step, `on_steps(first, last)` after each call of the compiled loop (steps first..last, any checkpoint of
that call saved), `on_checkpoint(step, path)` after each saved checkpoint and the final one, `on_end()`
after the final checkpoint. An int `checkpoint_every` asks for a checkpoint that often as well.
"""
from __future__ import annotations

from collections.abc import Callable

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunPaths


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
    """An `on_checkpoint(step, path)` callable as a hook (train's `on_checkpoint`, the Hub sync): its int
    `checkpoint_every` attribute, if it has one, is kept, and `end` runs at on_end."""

    def __init__(self, callback: Callable[[int, str], None], end: Callable[[], object] | None = None):
        self.callback, self.end = callback, end
        self.checkpoint_every = getattr(callback, "checkpoint_every", None)

    def on_checkpoint(self, step: int, path: str) -> None:
        self.callback(step, path)

    def on_end(self) -> None:
        if self.end is not None:
            self.end()


class FailAtStep(TrainHook):
    """Fail the try after the call of the loop that holds `step`, once per run: a marker in the run's folder
    (RunPaths.fault_marker) records it, so the retry, with the same hooks, resumes from the last checkpoint
    and finishes. `run_id`: only that run (on a shared test stack, the other runs train undisturbed)."""

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
        raise RuntimeError(f"Injected fault at step {self.step} (FailAtStep hook, raised after step {last}): a "
                           "retry resumes from the last checkpoint.")

