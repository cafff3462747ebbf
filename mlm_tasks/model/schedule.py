"""The learning-rate schedule: linear warmup, a stable phase at the peak (`wsd` only), then a decay to 0 at the
run's last step, which a time budget may move while the run trains (the decay re-anchors: no jump).

    schedule = decay_schedule(2e-3, 66, 1100, "1-sqrt", decay_fraction=0.2)   # wsd: stable until step 880
    schedule.at(step); schedule.replan(step=600, total=950)   # the plan: variables the checkpoint saves (lr_plan)
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, Literal

Shape = Literal["linear", "cosine", "1-sqrt"]


def decay_schedule(peak: float, warmup: int, total: int, kind: Shape, decay_fraction: float | None = None) -> Any:
    """A Keras LearningRateSchedule. `decay_fraction`: the decay's share of the steps, at the end (wsd); None:
    all after warmup."""
    return _schedule_class()(peak, warmup, total, kind, decay_fraction)


@cache
def _schedule_class() -> type:
    """Defined on first use: its base is Keras', and importing this module loads no TensorFlow."""
    import tf_keras

    class DecaySchedule(_DecayPlan, tf_keras.optimizers.schedules.LearningRateSchedule):
        pass

    return DecaySchedule


class _DecayPlan:
    def __init__(self, peak: float, warmup: int, total: int, kind: Shape, decay_fraction: float | None = None):
        import tensorflow as tf

        super().__init__()
        self.peak, self.warmup, self.kind, self.decay_fraction = float(peak), int(warmup), kind, decay_fraction
        self.plan = tf.Module(name="lr_plan")
        start = self._decay_start(total)
        self.plan.anchor_step = tf.Variable(float(start), trainable=False, name="anchor_step")
        self.plan.anchor_lr = tf.Variable(self.peak, trainable=False, name="anchor_lr")
        self.plan.end_step = tf.Variable(float(max(total, start + 1)), trainable=False, name="end_step")
        self.offset = tf.Variable(0.0, trainable=False, name="lr_offset")  # checkpointed with train.continue_run

    def _decay_start(self, total: int) -> int:
        fraction = self.decay_fraction
        return self.warmup if fraction is None else max(self.warmup, total - round(fraction * total))

    def __call__(self, step: Any) -> Any:
        import tensorflow as tf

        s = tf.cast(step, tf.float32) - self.offset
        anchor, anchor_lr, end = self.plan.anchor_step, self.plan.anchor_lr, self.plan.end_step
        done = tf.clip_by_value((s - anchor) / tf.maximum(end - anchor, 1.0), 0.0, 1.0)
        if self.kind == "linear":
            decayed = anchor_lr * (1.0 - done)
        elif self.kind == "cosine":
            decayed = anchor_lr * 0.5 * (1.0 + tf.cos(math.pi * done))
        else:  # 1-sqrt (Hägele et al. 2024): falls fastest at the start, long near 0
            decayed = anchor_lr * (1.0 - tf.sqrt(done))
        if not self.warmup:
            return decayed
        return tf.where(s < float(self.warmup), self.peak * s / float(self.warmup), decayed)

    def at(self, step: int) -> float:
        """The learning rate at the run's `step` (the optimizer's step count less the offset)."""
        return float(self(float(step) + self.offset))

    @property
    def total(self) -> int:
        return int(self.plan.end_step.numpy())

    def replan(self, step: int, total: int) -> None:
        """Decay to 0 at `total` (no earlier than `step`), from this step's learning rate once decaying."""
        start = self._decay_start(total)
        if step < start:  # warming up or stable: only the decay's start and end move
            anchor, lr, end = start, self.peak, max(total, start + 1)
        else:
            anchor, lr, end = step, self.at(step), max(total, step)
        self.plan.anchor_step.assign(float(anchor))
        self.plan.anchor_lr.assign(lr)
        self.plan.end_step.assign(float(end))

    def get_config(self) -> dict[str, Any]:  # Keras serialises an optimizer's schedule by its config
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total, "kind": self.kind,
                "decay_fraction": self.decay_fraction}  # fmt: skip
