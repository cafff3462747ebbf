"""The smoke command's driver (mlm_tasks/commands/smoke.py): the DAG's own decisions (mlm_tasks/job/decide.py),
carried out with sleeps where the train task defers.

    restarts = SmokeDriver(cfg, run_id, name, api=api, ensure=ensure, start_on=start, out=print).run()
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.job import restarts
from mlm_tasks.job.decide import Action, Facts, decide, gather
from mlm_tasks.job.follow import JobWatch, own_status, progress_line
from mlm_tasks.job.launch import DetachedJob
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import Restart, TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh

if TYPE_CHECKING:
    from google.cloud.tpu_v2 import TpuClient

log = logging.getLogger("mlm_tasks.commands.smoke")


class TrainingFailed(RuntimeError):
    """The trainer could not start, failed or stalled: the smoke run fails with its words (exit 1)."""


class SmokeDriver:
    """One process a person watches: facts, `decide`, then the action, until done or a failure."""

    def __init__(
        self,
        cfg: PipelineConfig,
        run_id: str,
        name: str,
        *,
        api: TpuClient | Any,
        ensure: Callable[[], tpu.NodeState],
        start_on: Callable[[tpu.NodeState], tuple[TrainJob, ssh.Connect]],
        out: Callable[[str], None],
        preempt_after: int | None = None,
    ) -> None:
        self.cfg, self.name, self.api, self.out = cfg, name, api, out
        self.ensure, self.start_on, self.preempt_after = ensure, start_on, preempt_after
        self.run_paths = RunPaths(cfg.output_root, run_id)
        self.deadline = time.time() + cfg.train.timeout_for(cfg.compute, cfg.tpu.ttl_hours) * 3600
        self.job: TrainJob | None = None
        self.watch: JobWatch | None = None
        self.operation: str | None = None  # the create under way, whose error explains a dead node
        self.asked = 0.0  # when it was asked for
        self.refused: str | None = None  # the create's refusal (a quota)
        self.used, self.rechecked, self.preempted, self.said = 0, False, False, 0.0
        self.stockout_until: float | None = None

    def run(self) -> list[Restart]:
        while True:
            action = decide(self.facts())
            if self.act(action):
                return restarts.read_restarts(self.run_paths)

    def facts(self) -> Facts:
        cfg = self.cfg
        node, error = tpu.node_now(cfg.tpu, self.name, self.operation, self.api)
        error, self.refused = self.refused or error, None
        if self.operation and not node.ready and time.time() - self.asked > cfg.tpu.create_wait_s():
            error = error or f"still {node.state} after {cfg.tpu.create_wait_s():g}s"
            node = replace(node, state="TIMEOUT")
        return gather(
            cfg,
            self.run_paths.run_id,
            node,
            job=self.job,
            watch=lambda job: self.watch,
            node_error=error,
            deadline=self.deadline,
            rechecked=self.rechecked,
            restarts=self.used,
            stockout_until=self.stockout_until,
        )

    def act(self, action: Action) -> bool:
        """Carries `action` out; True once the training is done. Waits are sleeps."""
        cfg, self.rechecked = self.cfg, False
        if action.kind == "ensure_node":
            self.out(f"TPU VM {self.name}: {action.why}.")
            made = self.ensure()
            self.refused = made.error
            if not made.error:
                self.operation, self.asked = made.operation or self.operation, time.time()
                time.sleep(cfg.tpu.poll_interval_s)
        elif action.kind == "wait" and action.wait_for == "capacity":
            self.out(f"No capacity ({action.why}): deleting, creating again in {cfg.tpu.stockout_retry_s:g}s.")
            tpu.delete_node(cfg.tpu, self.name, api=self.api)
            self.operation, self.stockout_until = None, action.until
            time.sleep(cfg.tpu.stockout_retry_s)
        elif action.kind == "wait":
            self.out(f"{action.why}; checking again in {cfg.tpu.poll_interval_s:g}s.")
            self.rechecked = action.wait_for == "recheck"
            time.sleep(cfg.tpu.poll_interval_s)
        elif action.kind == "restart":
            self.used += 1
            status = read_status(self.run_paths)
            restarts.record_restart(
                self.run_paths, cause=action.why, node=self.name, try_number=1, step=status["step"] if status else 0
            )
            self.out(f"Restart {self.used}: {action.why}. A new node, and a new trainer from the last checkpoint.")
            self.job = self.watch = None
        elif action.kind == "start":
            node = tpu.get_state(cfg.tpu, self.name, self.api)
            self.operation = None
            self.job, connect = self.start_on(node)
            stall_s = cfg.train.stall_minutes * 60
            self.watch = JobWatch(
                DetachedJob(self.job, connect), cfg.tpu, output_root=cfg.output_root, stall_s=stall_s, log=log
            )
        elif action.kind == "reattach":
            self._progress()
            time.sleep(cfg.train.follow_poll_s)
        elif action.kind == "done":
            self.out(f"Training done: {action.why}")
            return True
        else:
            self._fail(action)
        return False

    def _progress(self) -> None:
        assert self.job is not None
        status = own_status(self.job, read_status(self.run_paths))
        if status is not None and time.monotonic() - self.said >= self.cfg.train.progress_log_s:
            self.out(f"Training: {progress_line(status)}")
            self.said = time.monotonic()
        after = self.preempt_after
        if after is not None and not self.preempted and status is not None and status["step"] >= after:
            self.out(f"--preempt-after {after}: deleting TPU VM {self.name} at step {status['step']}, as Spot may.")
            tpu.delete_node(self.cfg.tpu, self.name, api=self.api)
            self.preempted = True

    def _fail(self, action: Action) -> None:
        message = action.why
        if self.watch is not None and action.stop:
            self.watch.stop()
        if self.watch is not None and action.about == "trainer":
            message += "\n" + self.watch.tail_text()
        raise TrainingFailed(message + (f"\n{action.advice}" if action.advice else ""))
