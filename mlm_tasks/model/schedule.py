"""The learning-rate schedule: linear warmup to the peak, then a decay to 0 at the run's last step, whose
last step can move while the run trains (train.budget_minutes re-plans it as the machine's pace changes).

    schedule = decay_schedule(peak=2e-3, warmup=66, total=1100, kind="linear")   # or "cosine"
    schedule(step)                        # the learning rate the optimizer uses at `step`
    schedule.replan(step=600, total=950)  # from here on, decay from schedule(600) to 0 at step 950

Until a re-plan it is exactly transformers' `create_optimizer` schedule (WarmUp + PolynomialDecay, power 1)
or WarmUp + Keras' CosineDecay. A re-plan re-anchors the decay at the current step and learning rate, so
the rate never jumps; its three numbers are variables (`schedule.plan`, saved in the checkpoint), so a
resumed run follows the same schedule as the run it continues.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any, Literal


def decay_schedule(peak: float, warmup: int, total: int, kind: Literal["linear", "cosine"]) -> Any:
    """A DecaySchedule (a Keras LearningRateSchedule, which the optimizer calls with its step)."""
    return _schedule_class()(peak, warmup, total, kind)


@cache
def _schedule_class() -> type:
    """The class, defined on first use: its base is Keras', and importing this module loads no TensorFlow."""
    import tf_keras

    class DecaySchedule(_DecayPlan, tf_keras.optimizers.schedules.LearningRateSchedule):
        pass

    return DecaySchedule


class _DecayPlan:
    def __init__(self, peak: float, warmup: int, total: int, kind: Literal["linear", "cosine"]):
        import tensorflow as tf

        super().__init__()
        self.peak, self.warmup, self.kind = float(peak), int(warmup), kind
        # A tf.Module tracks its variables: the checkpoint saves them as `lr_plan`.
        self.plan = tf.Module(name="lr_plan")
        self.plan.anchor_step = tf.Variable(float(self.warmup), trainable=False, name="anchor_step")
        self.plan.anchor_lr = tf.Variable(self.peak, trainable=False, name="anchor_lr")
        self.plan.end_step = tf.Variable(float(max(total, self.warmup + 1)), trainable=False, name="end_step")

    def __call__(self, step: Any) -> Any:
        import tensorflow as tf

        s = tf.cast(step, tf.float32)
        anchor, anchor_lr, end = self.plan.anchor_step, self.plan.anchor_lr, self.plan.end_step
        done = tf.clip_by_value((s - anchor) / tf.maximum(end - anchor, 1.0), 0.0, 1.0)
        if self.kind == "linear":
            decayed = anchor_lr * (1.0 - done)
        else:
            decayed = anchor_lr * 0.5 * (1.0 + tf.cos(math.pi * done))
        if not self.warmup:
            return decayed
        return tf.where(s < float(self.warmup), self.peak * s / float(self.warmup), decayed)

    @property
    def total(self) -> int:
        return int(self.plan.end_step.numpy())

    def replan(self, step: int, total: int) -> None:
        """Decay from this step's learning rate to 0 at `total` (no earlier than `step`)."""
        if step < self.warmup:  # still warming up: only the end moves, the decay starts at the peak
            self.plan.anchor_step.assign(float(self.warmup))
            self.plan.anchor_lr.assign(self.peak)
            self.plan.end_step.assign(float(max(total, self.warmup + 1)))
            return
        lr = float(self(step))
        self.plan.anchor_step.assign(float(step))
        self.plan.anchor_lr.assign(lr)
        self.plan.end_step.assign(float(max(total, step)))

    def get_config(self) -> dict[str, Any]:  # Keras serialises an optimizer's schedule by its config
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total, "kind": self.kind}
