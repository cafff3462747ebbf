"""The trainer's preemption notice: SIGTERM means "save now, then go", not "die mid-step".

    with preemption.notice_on_sigterm():   # the CLI's train step only (a trainer process of its own)
        ...                                 # the loop asks preemption.noticed() after each call
    except preemption.Preempted as err:     # raised by the loop once the checkpoint is saved
        sys.exit(preemption.PREEMPTED_EXIT)

A preempted or maintained TPU VM shuts down: the OS sends SIGTERM to every process and waits before
SIGKILL (30 s for a Spot VM's preemption). So does `job.launch.stop_command` (SIGTERM, then SIGKILL after
STOP_GRACE_S). The handler only sets a flag; the loop checks it after each call of the compiled loop
(`train.steps_per_call` steps), saves a checkpoint at that step, records the state "preempted" in
the status record and exits with PREEMPTED_EXIT, which the train task reads as a restart from that
step (mlm_tasks/job/follow.py), not as a failure. The notice costs the steps of the call under
way, not a checkpoint interval.

Installed by the CLI only: under an Airflow worker (`compute: local`) the task process belongs to
Airflow's task runner, whose own SIGTERM handling must stay as it is. The metadata server's
`instance/preempted` is not watched: SIGTERM reaches the trainer anyway, with less warning.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("mlm_tasks.steps.train")

PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again later", here from the checkpoint just saved
_notice = threading.Event()
_noticed_at: list[float] = []


class Preempted(Exception):
    """The loop stopped on the notice after saving a checkpoint at `step`."""

    def __init__(self, step: int, waited_s: float):
        super().__init__(
            f"Preemption notice (SIGTERM): checkpoint saved at step {step} {waited_s:.1f}s after the notice; "
            f"exiting with code {PREEMPTED_EXIT} so that the next trainer resumes at step {step}."
        )
        self.step = step


def noticed() -> bool:
    return _notice.is_set()


def waited_s() -> float:
    """Seconds since the notice (0 without one)."""
    return time.monotonic() - _noticed_at[0] if _noticed_at else 0.0


def _on_sigterm(signum: int, frame: Any) -> None:
    if not _notice.is_set():
        _noticed_at.append(time.monotonic())
        _notice.set()
        log.warning("Preemption notice (SIGTERM): saving a checkpoint after the steps under way, then exiting.")


@contextlib.contextmanager
def notice_on_sigterm() -> Iterator[None]:
    """SIGTERM sets the notice instead of ending the process, for the block (the main thread only)."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
