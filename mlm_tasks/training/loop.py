"""The steps of one training try, from its start step to the plan's last.

loop = TrainLoop(cfg, ctx.run, inputs, plan, state, hooks)
with loop.status:                  # runs/<run>/train/status.json: heartbeats, then done or failed
    loop.run()                     # ... the final checkpoint saved, every hook's on_end called
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.input import damaged_shard_error
from mlm_tasks.errors import TrainingDivergedError
from mlm_tasks.job import preemption
from mlm_tasks.job.status import StatusRecord
from mlm_tasks.model.flops import device_peak, flops_per_token
from mlm_tasks.paths import RunPaths
from mlm_tasks.training.budget import Deadline, record_end
from mlm_tasks.training.hooks import TrainHook
from mlm_tasks.training.plan import TrainInputs, TrainPlan, crossed
from mlm_tasks.training.progress import ProgressLog, write_history
from mlm_tasks.training.state import TrainState
from mlm_tasks.training.step import step_functions, train_input

log = logging.getLogger("mlm_tasks.steps.train")


class TrainLoop:
    def __init__(
        self,
        cfg: PipelineConfig,
        run: RunPaths,
        inputs: TrainInputs,
        plan: TrainPlan,
        state: TrainState,
        hooks: Sequence[TrainHook] = (),
    ):
        self.cfg, self.run_paths, self.inputs, self.plan, self.state = cfg, run, inputs, plan, state
        self.hooks = list(hooks)
        self.save_every = [cfg.train.checkpoint_every, *(h.checkpoint_every for h in hooks if h.checkpoint_every)]
        start, total = state.start_step, plan.total_steps
        self.total = total  # the run's last step: plan.total_steps, re-planned before each call with a budget
        budget, cap = plan.budget, cfg.train.steps
        self.deadline: Deadline | None = None
        self.try_began = self.used_before = 0.0
        if budget is not None and budget.started_at is not None:
            # What the budget used before this try: the checkpoint's count, or (a fresh run) the measuring.
            self.try_began = time.time()
            self.used_before = float(state.budget_used_s.numpy()) if start else self.try_began - budget.started_at
            self.deadline = Deadline(self.try_began + budget.seconds - self.used_before, budget.seconds_per_step, cap)
        self.end_s = {"checkpoint": 0.0, "validation": 0.0}  # what the run's end takes: the deadline keeps it
        # With a deadline the input runs on past the first plan: a faster machine may train more steps.
        take = (cap or 10**9) - start if self.deadline else total - start
        # train.continue_run: the input goes on after the batches the continued run's steps took.
        skip = start + int(state.schedule.offset.numpy())
        batches = train_input(cfg, inputs.shard_set, inputs.tokenizer, plan.global_batch, skip, take)
        self.iterator = iter(plan.strategy.distribute_datasets_from_function(batches))
        max_pred, clip = cfg.train.max_predictions_per_seq, cfg.train.clip_norm
        import tensorflow as tf

        self.stop = tf.Variable(False, trainable=False, name="preemption_notice")  # ends a call between steps
        preemption.on_notice(self.stop.assign)
        self.distributed_steps = step_functions(
            plan.strategy, state.model, state.optimizer, max_pred, plan.xla, clip, stop=self.stop
        )
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
        """Train to the plan's last step, save the final checkpoint, and end the hooks. A preemption notice
        ends a call after its step (mlm_tasks/job/preemption.py)."""
        step = self.state.start_step
        for hook in self.hooks:
            hook.on_start(self.run_paths, step, self.total)
        while self._replan(step) > step:
            first, step = step + 1, min(step + self.plan.per_call, self.total)
            step = self._steps(first, step)  # fewer steps when a notice ended the call
            if step != self.total and preemption.noticed():  # a notice to a CLI trainer: save here, then go
                self._answer_notice(step)
            if step != self.total and any(crossed(every, first, step) for every in self.save_every):
                self.save_checkpoint(step)
            for hook in self.hooks:
                hook.on_steps(first, step)
        self.progress.finish_loop()
        self.save_checkpoint(self.total)
        for hook in self.hooks:
            hook.on_end()
        if self.deadline is not None:
            record = record_end(self.run_paths, self.total, self.deadline.replans, self.used_s())
            log.info(
                "Time budget %(budget_minutes)g min: trained %(trained_steps)d steps in %(trained_s).1f s "
                "(%(overrun_s)+.1f s against the budget; planned %(steps)d at the start, re-planned %(replans)d "
                "times); train.steps=%(trained_steps)d repeats it",
                record,
            )

    def _replan(self, step: int) -> int:
        """The run's last step, before the call after `step`: the deadline's plan (the schedule, the progress
        lines and the status record follow it), or the plan's count."""
        if self.deadline is None:
            return self.total
        reserve = self.end_s["checkpoint"] + (self.end_s["validation"] if self.cfg.train.eval_every else 0.0)
        total = self.deadline.total_before_call(step, self.plan.per_call, self.total, reserve)
        last = self.state.history[-1] if self.state.history else {}
        ended = last.get("step") == step and (self.state.validate is None or "val_loss" in last)
        if total == step and not ended:  # a sudden slowdown ended it before the step's entry or validation
            total = step + 1
        if total != self.total:
            log.debug("Re-planned to %d steps at step %d (pace %.4f s/step)", total, step, self.deadline.pace())
            self.state.schedule.replan(step, total)
            self.total = self.progress.total = total
            self.status.retotal(total)
        return self.total

    def used_s(self) -> float:
        """Seconds of the time budget used so far, by this try and the ones before its checkpoint."""
        return self.used_before + time.time() - self.try_began if self.deadline else 0.0

    def _answer_notice(self, step: int) -> None:
        """A checkpoint at `step` when the last save fits in the notice's grace, else the last periodic one."""
        if preemption.fits(self.end_s["checkpoint"] or None):
            self.save_checkpoint(step)
            raise preemption.Preempted(step, preemption.waited_s())
        kept = self.state.checkpoints.latest_checkpoint
        raise preemption.Preempted(int(kept.rsplit("-", 1)[1]) if kept else 0, preemption.waited_s(), saved=False)

    def _steps(self, first: int, last: int) -> int:
        """One call of the compiled loop (steps first..last, fewer on a notice), its losses recorded, then
        validation if due; the last step it made."""
        rows = self._call(last - first + 1)
        last = first + len(rows) - 1
        eval_every = self.cfg.train.eval_every or 0  # 0: no validation during training
        due = bool(eval_every) and (crossed(eval_every, first, last) or last == self.total)
        self._check_finite(first, rows)
        for s, row in enumerate(rows, start=first):
            self.progress.record(s, *row, force=due and s == last)
        if first == self.state.start_step + 1:
            self.progress.compiled(last)  # the first call traced and compiled: throughput counts from here
        self.state.step.assign(last)
        validate, keep_best = self.state.validate, self.cfg.train.keep_checkpoint == "best"
        if validate is not None and due:
            began = time.monotonic()
            if self.progress.validation(last, *validate()[:2]) and keep_best:
                self.state.best.save(checkpoint_number=last)  # a new best: its weights, numbered by its step
            self.end_s["validation"] = time.monotonic() - began
        return last

    def _call(self, steps: int) -> Any:
        """[loss sum, masked tokens, correct] of each of `steps` steps; a shard failing its checksum is named."""
        import tensorflow as tf

        try:
            return self.distributed_steps(self.iterator, steps).numpy()
        except tf.errors.DataLossError as err:  # a record failed its checksum: the same bytes fail every retry
            bad = damaged_shard_error(self.inputs.shard_set, "train", err)
            if bad is None:
                raise
            raise bad from None

    def _check_finite(self, first: int, rows: Any) -> None:
        """Raise TrainingDivergedError at the call's first non-finite loss or gradient norm, before any save."""
        import numpy as np

        bad = np.flatnonzero(~np.isfinite(rows[:, [0, 3]]).all(axis=1))
        if not bad.size:
            return
        loss_sum, count, _, norm = rows[bad[0]]
        step, loss, kept = first + bad[0], loss_sum / max(count, 1), self.state.checkpoints.latest_checkpoint
        log.error("Step %d: loss %s, gradient norm %s: stopping before anything of it is saved", step, loss, norm)
        raise TrainingDivergedError(
            f"Training diverged at step {step}: loss {loss:.4g}, gradient norm "
            f"{norm:.4g}. Nothing after the last checkpoint was saved: "
            + (f"the last good checkpoint is {kept}" if kept else "no checkpoint was saved yet")
            + ". A rerun of this run resumes there and meets the same batches: lower train.learning_rate or "
            "train.clip_norm, or train in fp32 (train.mixed_precision=off), in a new run."
        )

    def save_checkpoint(self, step: int) -> None:
        began = time.monotonic()
        self.state.budget_used_s.assign(self.used_s())
        path = self.state.checkpoints.save(checkpoint_number=step)
        self.end_s["checkpoint"] = time.monotonic() - began
        write_history(self.run_paths, self.state.history)
        for hook in self.hooks:
            hook.on_checkpoint(step, path)  # the Hub sync queues the upload and returns at once
