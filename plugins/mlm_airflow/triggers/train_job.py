"""Trigger that follows a detached trainer on a TPU VM, so that a training of hours holds no worker slot: every
poll_s one `JobWatch.check` (mlm_tasks/job/follow.py), until it fires once with {"kind", "detail", "exit_code",
"job"} at an end (done, failed, stalled, lost). `on_kill` (the task marked failed or cleared) stops the trainer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow.triggers.base import TriggerEvent

from mlm_airflow.connections import ssh_connect
from mlm_airflow.triggers import ConnectionTrigger
from mlm_tasks import storage
from mlm_tasks.config import TpuConfig
from mlm_tasks.errors import TransientError
from mlm_tasks.job.follow import JobWatch, Verdict
from mlm_tasks.job.launch import DetachedJob, Log
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu

ENDS = ("done", "failed", "stalled", "lost")
# A check's SSH login is retried this long (the start's: 300 s): a node that does not answer is soon
# asked about at the TPU API instead, which tells a preemption at once.
CHECK_PATIENCE_S = 60.0
# Each poll is a short SSH session: paramiko's info lines would bury the progress lines in the task's log.
logging.getLogger("paramiko.transport").setLevel(logging.WARNING)
T = TypeVar("T")


def connected_watch(tpu_cfg: TpuConfig, job: TrainJob, *, output_root: str, stall_s: float, log: Log) -> JobWatch:
    """A watch of `job` that logs in as the run's SSH connection, pinning the host keys the node published."""
    api = tpu.client(tpu_cfg)
    connect = ssh_connect(
        tpu_cfg.ssh_conn_id,
        tpu_cfg.ssh_port,
        CHECK_PATIENCE_S,
        node=job["node"],
        published=tpu.published_keys(tpu_cfg, job["node"], api=api),
    )
    return JobWatch(DetachedJob(job, connect), tpu_cfg, output_root=output_root, stall_s=stall_s, log=log)


@dataclass(kw_only=True, eq=False, repr=False)
class TrainJobTrigger(ConnectionTrigger):
    classpath = "mlm_airflow.triggers.train_job.TrainJobTrigger"

    output_root: str
    job: TrainJob
    tpu_config: dict[str, Any]
    poll_s: float
    stall_s: float
    progress_s: float
    storage_timeout_s: float
    gcp_conn_id: str
    _watch: JobWatch | None = field(default=None, init=False)

    def _with_connection(self, call: Callable[[JobWatch], T]) -> T:
        """call(watch) with the run's GCP connection (read once per trigger run) for gs:// and the TPU API."""
        storage.set_timeout(self.storage_timeout_s)
        with self.connected():
            if self._watch is None:
                self._watch = connected_watch(
                    TpuConfig.model_validate(self.tpu_config),
                    self.job,
                    output_root=self.output_root,
                    stall_s=self.stall_s,
                    log=self.log,
                )
            return call(self._watch)

    def _check(self) -> Verdict:
        return self._with_connection(lambda watch: watch.check())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from google.api_core.exceptions import RetryError, ServerError, TooManyRequests

        # What a blip looks like (requests' errors are OSErrors): poll again.
        blips = (TransientError, OSError, ServerError, TooManyRequests, RetryError, asyncio.TimeoutError)
        who = f"the trainer (pid {self.job['pid']}, try {self.job['try_number']}) on {self.job['node']}"
        self.log.info(
            "Following %s every %gs; progress every %gs, watchdog after %g min without a heartbeat.",
            *(who, self.poll_s, self.progress_s, self.stall_s / 60),
        )
        last_line = 0.0
        while True:
            try:
                # Awaited to its end, never abandoned: every call in it has its own deadline, so a hung network
                # fails the check instead of leaving a thread blocked in the triggerer's shared pool.
                verdict: Verdict | None = await asyncio.to_thread(self._check)
            except blips as err:
                self.log.warning("Could not check %s (will retry): %s", who, err)
                verdict = None
            if verdict is not None and verdict.kind in ENDS:
                yield TriggerEvent(
                    {"kind": verdict.kind, "detail": verdict.detail, "exit_code": verdict.exit_code, "job": self.job}
                )
                return
            if verdict is not None and time.monotonic() - last_line >= self.progress_s:
                self.log.info("Training: %s", verdict.detail)
                last_line = time.monotonic()
            await asyncio.sleep(self.poll_s)

    async def on_kill(self) -> None:
        """The task was marked failed or cleared while it waited: stop the trainer."""
        probe = await asyncio.to_thread(self._with_connection, lambda watch: watch.stop())
        self.log.info("Task killed: the trainer is %s.", "gone" if probe.alive is False else "maybe still running")
