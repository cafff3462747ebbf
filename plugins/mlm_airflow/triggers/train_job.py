"""Trigger that follows a detached trainer on a TPU VM (runs in the triggerer), so that a training of
hours holds no worker slot.

    TrainJobTrigger(config=cfg.model_dump(mode="json"), job=job, workers=1)   # what TrainOperator defers to

Every train.follow_poll_s it runs one `JobWatch.check` (plugins/mlm_airflow/operators/train_job.py: an SSH
probe of the job, the status record from output_root, the node's state when SSH does not answer) in a thread, with the
run's GCP connection, and logs a progress line (step, loss, tokens/s, ETA) every
train.progress_log_s. It fires once, with {"kind", "detail", "exit_code", "job", "workers"}, when the
verdict is done, failed or stalled; the task resumes in `TrainOperator.trainer_ended`, which succeeds,
fails with the log's last lines, or stops a stalled trainer and fails the try.

What survives what: a triggerer restart rebuilds the trigger from `serialize()` and it follows on,
the same try and the same trainer (the stall clock is the record's heartbeat, not this process's).
A poll that meets a transient error (a GCS 503, a TPU API 5xx) polls again. `on_kill` (Airflow calls
it when a user marks the deferred task failed or clears it, never on a triggerer restart) stops the
trainer over SSH. Airflow only calls on_kill on a trigger the triggerer runs: a mark in the second or two
before it picks the trigger up leaves the trainer to the teardown, whose delete of the VM ends it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import TransientError
from mlm_tasks.model.follow import Verdict
from mlm_tasks.results import TrainJob

ENDS = ("done", "failed", "stalled")
# Each poll is a short SSH session: paramiko's "Connected" and "Authentication successful" lines would
# bury the progress lines in the task's log. Its warnings and errors still show.
logging.getLogger("paramiko.transport").setLevel(logging.WARNING)


# Stored with every deferred task and imported by the triggerer: a rename must keep this path importable.
CLASSPATH = "mlm_airflow.triggers.train_job.TrainJobTrigger"


class TrainJobTrigger(BaseTrigger):
    def __init__(self, config: dict[str, Any], job: dict[str, Any], workers: int = 1):
        super().__init__()
        self.config = config
        self.job = job
        self.workers = workers
        self._cfg = PipelineConfig.model_validate(config)
        self._credentials: tuple[Any, str | None] | None = None
        self._watch: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # Airflow puts the plugins folder on the triggerer's sys.path (settings.prepare_syspath_for_config_and_plugins):
        # the triggerer imports the package by this path.
        return (CLASSPATH,
                {"config": self.config, "job": self.job, "workers": self.workers})

    def _with_connection(self, call: Any) -> Any:
        """call(watch) with the run's GCP connection (read once per trigger run) for gs:// and the TPU API."""
        from mlm_airflow.connections import connection_credentials
        from mlm_airflow.operators.train_job import JobWatch
        from mlm_tasks import credentials

        storage.set_timeout(self._cfg.storage.timeout_s)
        if self._credentials is None:
            self._credentials = connection_credentials(self._cfg.gcp_conn_id)
        with credentials.use(*self._credentials, source=f"Airflow connection {self._cfg.gcp_conn_id!r}"):
            if self._watch is None:
                job: TrainJob = self.job  # type: ignore[assignment]
                self._watch = JobWatch.connected(self._cfg, job, self.log)
            return call(self._watch)

    def _check(self) -> Verdict:
        return self._with_connection(lambda watch: watch.check())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import requests
        from google.api_core.exceptions import RetryError, ServerError, TooManyRequests

        train = self._cfg.train
        who = f"the trainer (pid {self.job['pid']}, try {self.job['try_number']}) on {self.job['node']}"
        self.log.info("Following %s every %gs; progress every %gs, watchdog after %g min without a heartbeat.",
                      who, train.follow_poll_s, train.progress_log_s, train.stall_minutes)
        last_line = 0.0
        while True:
            try:
                # Awaited to its end, never abandoned: every call in it has its own deadline (the SSH login's
                # patience and idle bound, storage.timeout_s, tpu.api_timeout_s), so a hung network fails the
                # check instead of leaving a thread blocked in the triggerer's shared pool.
                verdict: Verdict | None = await asyncio.to_thread(self._check)
            except (TransientError, OSError, ServerError, TooManyRequests, RetryError, requests.RequestException,
                    asyncio.TimeoutError) as err:  # what a blip looks like: poll again
                self.log.warning("Could not check %s (will retry): %s", who, err)
                verdict = None
            if verdict is not None and verdict.kind in ENDS:
                yield TriggerEvent({"kind": verdict.kind, "detail": verdict.detail, "exit_code": verdict.exit_code,
                                    "job": self.job, "workers": self.workers})
                return
            if verdict is not None and time.monotonic() - last_line >= train.progress_log_s:
                self.log.info("Training: %s", verdict.detail)
                last_line = time.monotonic()
            await asyncio.sleep(train.follow_poll_s)

    async def on_kill(self) -> None:
        """The task was marked failed or cleared while it waited: stop the trainer."""
        probe = await asyncio.to_thread(self._with_connection, lambda watch: watch.stop())
        self.log.info("Task killed: the trainer is %s.", "gone" if probe.alive is False else "maybe still running")
