"""The trainer's preemption notice: SIGTERM, or the metadata server announcing maintenance or a preemption,
means "save now, then go", not "die mid-step".

    with preemption.notice_on_sigterm():    # the CLI's train step only (under Airflow, SIGTERM is Airflow's)
        preemption.on_notice(stop.assign)     # the compiled loop reads `stop` between its steps
    except preemption.Preempted as err:       # the loop saved a checkpoint (or knows the last one): exit 75
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("mlm_tasks.steps.train")

PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again later", here from the checkpoint just saved
GRACE_S = 30.0  # SIGTERM to SIGKILL on a Spot VM's preemption (Google's documented shutdown period)
METADATA_POLL_S = 5.0
_notice = threading.Event()
_noticed: list[tuple[float, str]] = []  # (monotonic time, what) of the first notice
_callbacks: list[Callable[[bool], Any]] = []
_active: list[bool] = []  # inside notice_on_sigterm


class Preempted(Exception):
    """The loop stopped on the notice at a checkpoint of `step` (saved now, or the last periodic one)."""

    def __init__(self, step: int, waited_s: float, saved: bool = True):
        what = _noticed[0][1] if _noticed else "SIGTERM"
        how = (
            f"checkpoint saved at step {step} {waited_s:.1f}s after the notice"
            if saved
            else f"no time to save within the {GRACE_S:g}s grace: the last periodic checkpoint, step {step}, "
            "is where the next trainer resumes"
        )
        super().__init__(
            f"Preemption notice ({what}): {how}; exiting with code {PREEMPTED_EXIT} so that the next trainer "
            f"resumes at step {step}."
        )
        self.step = step


def noticed() -> bool:
    return _notice.is_set()


def waited_s() -> float:
    """Seconds since the notice (0 without one)."""
    return time.monotonic() - _noticed[0][0] if _noticed else 0.0


def fits(save_s: float | None) -> bool:
    """Whether a save that took `save_s` last time still fits in the grace left (unknown: try it)."""
    return save_s is None or waited_s() + save_s < GRACE_S


def on_notice(callback: Callable[[bool], Any]) -> None:
    """`callback(True)` at the notice (at once, if one came already): how the compiled loop's flag is set.
    Only inside notice_on_sigterm (elsewhere no notice comes)."""
    if _active:
        _callbacks.append(callback)
    if _active and _notice.is_set():
        callback(True)


def notify(what: str) -> None:
    if _notice.is_set():
        return
    _noticed.append((time.monotonic(), what))
    _notice.set()
    log.warning("Preemption notice (%s): saving a checkpoint after the step under way, then exiting.", what)
    for callback in _callbacks:
        callback(True)


def _wakeups(read_fd: int, stop: threading.Event) -> None:
    """The C handler writes the signal's number here at once, while the main thread is inside a TF call."""
    with contextlib.suppress(OSError):
        while got := os.read(read_fd, 16):  # b"": the block ended (its write end closed)
            if signal.SIGTERM in got and not stop.is_set():
                notify("SIGTERM")
    os.close(read_fd)


def _metadata(stop: threading.Event) -> None:
    """Polls the metadata server for an announced maintenance or a preemption; gone quiet off GCE."""
    import requests

    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    base = f"http://{host}/computeMetadata/v1/instance"
    while not stop.is_set() and not _notice.is_set():
        try:
            event = requests.get(f"{base}/maintenance-event", headers={"Metadata-Flavor": "Google"}, timeout=2).text
            preempted = requests.get(f"{base}/preempted", headers={"Metadata-Flavor": "Google"}, timeout=2).text
        except requests.RequestException:
            return  # no metadata server: not on Google Cloud
        if event.strip() not in ("", "NONE"):
            notify(f"maintenance-event {event.strip()}")
        elif preempted.strip().upper() == "TRUE":
            notify("metadata preempted TRUE")
        stop.wait(METADATA_POLL_S)


@contextlib.contextmanager
def notice_on_sigterm() -> Iterator[None]:
    """SIGTERM (and the metadata server's notices) set the notice instead of ending the process, for the
    block (the main thread only)."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: notify("SIGTERM"))
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    stop = threading.Event()
    _active.append(True)
    for target, args in ((_wakeups, (read_fd, stop)), (_metadata, (stop,))):
        threading.Thread(target=target, args=args, name=f"preemption-{target.__name__}", daemon=True).start()
    try:
        yield
    finally:
        stop.set()
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, previous)
        os.close(write_fd)  # the reader's os.read then ends
        _callbacks.clear()
        _active.clear()
