"""The trainer's status record, runs/<run>/train/status.json: one small file whoever watches a training reads.

with StatusRecord(run, total_steps=3500, start_step=1200, heartbeat_s=30) as status:   # starts += 1
    ... status.progress(step, loss, tokens_per_s, eta_s) ...   # a thread beats every heartbeat_s
# leaving records done (0), preempted (75: resume at its step) or failed (2: no retry helps; 1: else)
record = read_status(run)          # None before a trainer has started
why = stalled(record, stall_s=1800)   # None, or what is stale: the heartbeat or the step
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from types import TracebackType
from typing import cast

from mlm_tasks import storage
from mlm_tasks.errors import NO_RETRY_EXIT, NoRetryError
from mlm_tasks.job import preemption, restarts
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainStatus

log = logging.getLogger(__name__)
TRY_NUMBER_VARS = ("MLM_TRY_NUMBER", "AIRFLOW_CTX_TRY_NUMBER")


def read_status(run: RunPaths) -> TrainStatus | None:
    """The run's status record, or None when no trainer has written one (or it is unreadable)."""
    try:
        record = storage.read_json_if_exists(run.train_status)
    except ValueError:  # a torn copy: the next heartbeat rewrites it whole
        return None
    return cast(TrainStatus, record) if isinstance(record, dict) and "heartbeat" in record else None


def stalled(record: TrainStatus, stall_s: float, now: float | None = None) -> str | None:
    """Why a running trainer counts as stalled (None: it is not, or it is no longer running)."""
    if record["state"] != "running":
        return None
    now = time.time() if now is None else now
    setting = f"train.stall_minutes is {stall_s / 60:g}"
    who = f"the trainer (pid {record['pid']} on {record['host']})"
    if now - record["heartbeat"] > stall_s:
        return f"no heartbeat for {now - record['heartbeat']:.0f}s ({setting}): {who} is frozen or gone"
    if now - record["step_time"] > stall_s:
        stuck = f"still at step {record['step']}: {who} is stuck"
        return f"no new step for {now - record['step_time']:.0f}s ({setting}), {stuck}"
    return None


def _try_number() -> int | None:
    values = [os.environ.get(name, "") for name in TRY_NUMBER_VARS]
    return next((int(value) for value in values if value.isdigit()), None)


class StatusRecord:
    """Writes one trainer's status record: at start, at every progress line, every heartbeat_s, and at the end."""

    def __init__(self, run: RunPaths, *, total_steps: int, start_step: int, heartbeat_s: float):
        previous = read_status(run)
        now = time.time()
        self.run, self.heartbeat_s = run, heartbeat_s
        self.record: TrainStatus = {
            "state": "running",
            "step": start_step,
            "total_steps": total_steps,
            "last_loss": None,
            "tokens_per_s": None,
            "eta_s": None,
            "heartbeat": now,
            "heartbeat_utc": "",
            "step_time": now,
            "try_number": _try_number(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "starts": (previous["starts"] if previous else 0) + 1,
            "exit_code": None,
            "error": None,
        }
        self._lock = threading.Lock()  # the record, updated by the loop and read by the heartbeat
        self._write_lock = threading.Lock()  # one write at a time, so an older snapshot never lands last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="train-status-heartbeat", daemon=True)

    def __enter__(self) -> StatusRecord:
        # The restart this trainer answers is closed at its start step; the record carries them all.
        self.record["restarts"] = restarts.close_open(self.run, self.record["step"])
        self._write()
        self._thread.start()
        log.info(
            "Trainer status in %s (start %d of this run, try %s, pid %d on %s).",
            self.run.train_status,
            self.record["starts"],
            self.record["try_number"],
            self.record["pid"],
            self.record["host"],
        )
        return self

    def progress(self, step: int, loss: float | None, tokens_per_s: float | None, eta_s: float | None) -> None:
        with self._lock:
            record = self.record
            record["step"], record["last_loss"] = step, loss
            record["tokens_per_s"], record["eta_s"], record["step_time"] = tokens_per_s, eta_s, time.time()
        self._write()

    def retotal(self, total_steps: int) -> None:
        """The run's last step moved (a time budget re-planned it): the next write says so."""
        with self._lock:
            self.record["total_steps"] = total_steps

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=self.heartbeat_s + 10)
        with self._lock:
            if kind is None:
                self.record["state"], self.record["exit_code"] = "done", 0
            elif isinstance(err, preemption.Preempted):  # a checkpoint at its step: resume there, not a failure
                self.record["state"], self.record["exit_code"] = "preempted", preemption.PREEMPTED_EXIT
                self.record["step"], self.record["error"] = err.step, str(err)
            else:
                self.record["state"] = "failed"
                self.record["exit_code"] = NO_RETRY_EXIT if isinstance(err, NoRetryError) else 1
                self.record["error"] = f"{kind.__name__}: {err}"[:2000]
        try:
            self._write()
        except OSError as write_err:  # the training's own outcome matters more than this record of it
            log.warning("Could not record the trainer's end in %s: %s", self.run.train_status, write_err)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._write()
            except OSError as err:  # a missed beat is logged; the next one tries again
                log.warning("Trainer heartbeat not written to %s: %s", self.run.train_status, err)

    def _write(self) -> None:
        with self._write_lock:
            with self._lock:
                now = time.time()
                self.record["heartbeat"] = now
                self.record["heartbeat_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
                snapshot = dict(self.record)
            storage.write_json(self.run.train_status, snapshot)
