"""The train step's fourth part: the steps of one try, from its start step to the plan's last.

    loop = TrainLoop(cfg, ctx.run, inputs, plan, state, hooks)
    with loop.status:                  # runs/<run>/train/status.json: heartbeats, then done or failed
        loop.run()                     # ... the final checkpoint saved, every hook's on_end called
        loop.progress.tokens_per_s     # what the summary reports

Each call of the compiled loop runs `plan.per_call` steps; validation, checkpoints and the hooks'
on_steps land on a call's last step. A checkpoint is saved every train.checkpoint_every steps (and as
often as a hook's `checkpoint_every` asks), with the history up to it; a rerun of the run restores the
latest one and skips the batches it already consumed, so a killed process loses at most one checkpoint
interval and finishes at exactly the planned step count. A preemption notice (SIGTERM to a CLI trainer,
mlm_tasks/training/preemption.py) saves a checkpoint after the call under way and stops there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths
from mlm_tasks.training import preemption
from mlm_tasks.training.hooks import TrainHook
from mlm_tasks.training.plan import TrainInputs, TrainPlan, crossed
from mlm_tasks.training.progress import ProgressLog, write_history
from mlm_tasks.training.state import TrainState
from mlm_tasks.training.status import StatusRecord
from mlm_tasks.training.step import step_functions, train_input

log = logging.getLogger("mlm_tasks.steps.train")


class TrainLoop:
    """One try's steps: the input from the start step on, the compiled step, the progress and status
    records, and the hooks."""

    def __init__(
        self,
        cfg: PipelineConfig,
        run: RunPaths,
        inputs: TrainInputs,
        plan: TrainPlan,
        state: TrainState,
        hooks: Sequence[TrainHook] = (),
    ):
        from mlm_tasks.model.flops import device_peak, flops_per_token

        self.cfg, self.run_paths, self.inputs, self.plan, self.state = cfg, run, inputs, plan, state
        self.hooks = list(hooks)
        self.save_every = [
            cfg.train.checkpoint_every,
            *(hook.checkpoint_every for hook in hooks if hook.checkpoint_every),
        ]
        start, total = state.start_step, plan.total_steps
        batches = train_input(cfg, inputs.shard_set, inputs.tokenizer, plan.global_batch, start, total - start)
        self.iterator = iter(plan.strategy.distribute_datasets_from_function(batches))
        max_pred = cfg.train.max_predictions_per_seq
        self.distributed_steps = step_functions(plan.strategy, state.model, state.optimizer, max_pred, plan.xla)
        self.flops_per_token = flops_per_token(state.model.config, inputs.shard_set.max_length, max_pred)
        self.peak = device_peak(plan.device, plan.precision, plan.replicas, cfg.tpu.accelerator_type)
        log.info("%.1f MFLOP per token (training); peak %s", self.flops_per_token / 1e6, self.peak.describe())
        self.status = StatusRecord(run, total_steps=total, start_step=start, heartbeat_s=cfg.train.heartbeat_s)
        self.progress = ProgressLog(
            state.history,
            start,
            total,
            cfg.train.log_every,
            plan.global_batch * inputs.shard_set.max_length,
            run.tensorboard,
            state.schedule,
            on_line=self.status.progress,
            flops_per_token=self.flops_per_token,
            peak_flops=self.peak.total,
        )

    def run(self) -> None:
        """Train to the plan's last step, save the final checkpoint, and end the hooks."""
        start, total = self.state.start_step, self.plan.total_steps
        for hook in self.hooks:
            hook.on_start(self.run_paths, start, total)
        step = start
        while step < total:
            first, step = step + 1, min(step + self.plan.per_call, total)
            self._steps(first, step)
            if step != total and preemption.noticed():  # SIGTERM to a CLI trainer: save here, then go
                self.save_checkpoint(step)
                raise preemption.Preempted(step, preemption.waited_s())
            if step != total and any(crossed(every, first, step) for every in self.save_every):
                self.save_checkpoint(step)
            for hook in self.hooks:
                hook.on_steps(first, step)
        self.progress.finish_loop()
        self.save_checkpoint(total)
        for hook in self.hooks:
            hook.on_end()

    def _steps(self, first: int, last: int) -> None:
        """One call of the compiled loop (steps first..last), its losses recorded, then validation if due."""
        eval_every = self.cfg.train.eval_every or 0  # 0: no validation during training
        due = bool(eval_every) and (crossed(eval_every, first, last) or last == self.plan.total_steps)
        for s, row in enumerate(self._call(last - first + 1), start=first):
            self.progress.record(s, *row, force=due and s == last)
        if first == self.state.start_step + 1:
            self.progress.compiled(last)  # the first call traced and compiled: throughput counts from here
        self.state.step.assign(last)
        validate, keep_best = self.state.validate, self.cfg.train.keep_checkpoint == "best"
        if validate is not None and due and self.progress.validation(last, *validate()[:2]) and keep_best:
            self.state.best.save(checkpoint_number=last)  # a new best: its weights, numbered by its step

    def _call(self, steps: int) -> Any:
        """[loss sum, masked tokens, correct] of each of `steps` steps; a shard failing its checksum is named."""
        import tensorflow as tf

        from mlm_tasks.data.input import damaged_shard_error

        try:
            return self.distributed_steps(self.iterator, steps).numpy()
        except tf.errors.DataLossError as err:  # a record failed its checksum: the same bytes fail every retry
            bad = damaged_shard_error(self.inputs.shard_set, "train", err)
            if bad is None:
                raise
            raise bad from None

    def save_checkpoint(self, step: int) -> None:
        path = self.state.checkpoints.save(checkpoint_number=step)
        write_history(self.run_paths, self.state.history)
        for hook in self.hooks:
            hook.on_checkpoint(step, path)  # the Hub sync queues the upload and returns at once
