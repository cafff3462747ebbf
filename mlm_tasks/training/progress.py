"""Training progress: the log lines, the TensorBoard scalars and the history the report plots.

history = read_history(run)          # runs/<run>/train/history.jsonl: train resumes it, report plots it
write_history(run, history)          # at every checkpoint
best_so_far(history)                 # (step, val_loss) of the lowest validation loss (train.eval_every)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths

log = logging.getLogger("mlm_tasks.steps.train")


def read_history(run: RunPaths) -> list[dict[str, Any]]:
    """train/history.jsonl, one entry per logged step; a line that is not an entry with a step (a killed
    writer's torn last line) is skipped."""
    if not storage.exists(run.train_history):
        return []
    rows = []
    for line in storage.read_text(run.train_history).splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def best_so_far(history: list[dict[str, Any]]) -> tuple[int, float] | None:
    """(step, validation loss) of the lowest validation loss in the history; the earliest on a tie."""
    scored = [(row["val_loss"], row["step"]) for row in history if isinstance(row.get("val_loss"), (int, float))]
    if not scored:
        return None
    loss, step = min(scored)
    return step, loss


def write_history(run: RunPaths, history: list[dict[str, Any]]) -> None:
    storage.write_text(run.train_history, "".join(json.dumps(h) + "\n" for h in history))


class ProgressLog:
    def __init__(
        self,
        history: list[dict[str, Any]],
        start_step: int,
        total_steps: int,
        every: int,
        tokens_per_step: int,
        tensorboard_uri: str,
        schedule,
        on_line: Callable[[int, float, float, float], None],
        flops_per_token: float,
        peak_flops: float | None,
    ):
        """`on_line(step, loss, tokens_per_s, eta_s)` is called at every progress line (the status record);
        with the devices' `peak_flops` known each line carries the MFU."""
        import tensorflow as tf

        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.history, self.start, self.total, self.every = history, start_step, total_steps, every
        self.tokens_per_step, self.schedule, self.on_line = tokens_per_step, schedule, on_line
        self.writer = tf.summary.create_file_writer(tensorboard_uri)
        self.t0 = self.t_last = time.time()
        self.t_steady: float | None = None
        self.steady_from = start_step + 1
        self.steady_s = self.elapsed_s = 0.0
        self.window = [0.0, 0.0, 0.0, 0.0]  # summed loss, masked tokens, correct predictions, gradient norms
        self.last_logged = start_step

    def record(self, step: int, loss_sum, count, correct, grad_norm, *, force: bool = False) -> None:
        """One step's sums and gradient norm; a progress line (and history entry, with the mean norm) every
        `every` steps, or when `force`d (a validation step: its entry carries the validation loss)."""
        self.window = [w + float(v) for w, v in zip(self.window, (loss_sum, count, correct, grad_norm), strict=True)]
        if force or step % self.every == 0 or step in (self.total, self.start + 1):
            self._emit(step)

    def compiled(self, step: int) -> None:
        """The first call (which traces and compiles) ended at `step`: steady-state throughput counts from there."""
        self.t_steady, self.steady_from = time.time(), step

    def validation(self, step: int, loss: float, accuracy: float) -> bool:
        """Adds the validation loss of `step` to its entry (which `record(..., force=True)` just wrote);
        True when it is the best so far."""
        import tensorflow as tf

        self.history[-1].update(val_loss=loss, val_accuracy=accuracy)
        best_step, best_loss = best_so_far(self.history) or (step, loss)
        log.info(
            "validation at step %d: loss %.4f acc %.3f (best %.4f at step %d)",
            step,
            loss,
            accuracy,
            best_loss,
            best_step,
        )
        with self.writer.as_default(step=step):
            tf.summary.scalar("val/loss", loss)
            tf.summary.scalar("val/accuracy", accuracy)
        return best_step == step

    def _emit(self, step: int) -> None:
        import tensorflow as tf

        now = time.time()
        loss_sum, count, correct, norms = self.window
        entry = {
            "step": step,
            "loss": loss_sum / max(count, 1),
            "accuracy": correct / max(count, 1),
            "learning_rate": self.schedule.at(step),
            "grad_norm": norms / max(step - self.last_logged, 1),
            "tokens_per_s": (step - self.last_logged) * self.tokens_per_step / max(now - self.t_last, 1e-9),
            "elapsed_s": now - self.t0,
        }
        if self.peak_flops:
            entry["mfu"] = entry["tokens_per_s"] * self.flops_per_token / self.peak_flops
        self.history.append(entry)
        eta = (self.total - step) * (now - self.t0) / max(step - self.start, 1)
        mfu = f" MFU {100 * entry['mfu']:.1f}%" if "mfu" in entry else ""
        log.info(
            "step %(step)d/%(total)d loss %(loss).4f acc %(accuracy).3f lr %(learning_rate).2e grad norm "
            "%(grad_norm).3g %(tokens_per_s).0f tokens/s%(mfu_text)s eta %(eta).0fs",
            {**entry, "total": self.total, "mfu_text": mfu, "eta": eta},
        )
        with self.writer.as_default(step=step):
            for key in ("loss", "accuracy", "learning_rate", "grad_norm", "tokens_per_s", "mfu"):
                if key in entry:
                    tf.summary.scalar(f"train/{key}", entry[key])
        self.on_line(step, entry["loss"], entry["tokens_per_s"], eta)
        self.window, self.t_last, self.last_logged = [0.0, 0.0, 0.0, 0.0], now, step

    def finish_loop(self) -> None:
        """Call right after the last step, before saving: fixes the steady-state time."""
        self.steady_s = time.time() - self.t_steady if self.t_steady else 0.0
        self.elapsed_s = time.time() - self.t0
        self.writer.flush()

    @property
    def tokens_per_s(self) -> float | None:
        steps = self.total - self.steady_from
        return steps * self.tokens_per_step / self.steady_s if steps > 0 and self.steady_s else None
