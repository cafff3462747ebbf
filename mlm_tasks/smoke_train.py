"""The smoke tool's training (mlm_tasks/smoke.py), on the production path: the trainer started detached on
worker 0 and followed as the DAG's train task follows it (mlm_tasks/tpu/job.py, JobWatch's verdicts in
mlm_tasks/training/follow.py); a lost node is replaced and a new trainer resumes from the last checkpoint,
recorded as a restart (mlm_tasks/training/restarts.py), up to train.max_restarts.

    restarts = follow_detached(cfg, run_id, name, start_on=start, ready_node=replace, out=print, preempt_after=20)

`preempt_after` N deletes the node once the trainer has recorded step N, as a preemption would take it, to
prove that restart end to end on a real project. The follow is a loop here, not a trigger: the smoke tool
is one process that a person watches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import Restart, TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh
from mlm_tasks.tpu.job import DetachedJob
from mlm_tasks.training import restarts
from mlm_tasks.training.follow import JobWatch, own_status, progress_line
from mlm_tasks.training.status import read_status

if TYPE_CHECKING:
    from google.cloud.tpu_v2 import TpuClient

log = logging.getLogger("mlm_tasks.smoke")

Start = Callable[[tpu.NodeState], tuple[TrainJob, ssh.Connect]]


class TrainingFailed(RuntimeError):
    """The trainer could not start, failed or stalled: the smoke run fails with its words (exit 1)."""


def follow_detached(
    cfg: PipelineConfig,
    run_id: str,
    name: str,
    node: tpu.NodeState,
    *,
    start_on: Start,
    ready_node: Callable[[], tpu.NodeState],
    out: Callable[[str], None],
    preempt_after: int | None = None,
    api: TpuClient | None = None,
) -> list[Restart]:
    """Runs the training to its end; the restarts it took. Raises RuntimeError when the trainer fails,
    stalls, or loses its node more than train.max_restarts times."""
    run = RunPaths(cfg.output_root, run_id)
    job, connect = start_on(node)
    preempted, losses, said = False, 0, 0.0
    while True:
        watch = JobWatch(
            DetachedJob(job, connect),
            cfg.tpu,
            output_root=cfg.output_root,
            stall_s=cfg.train.stall_minutes * 60,
            log=log,
        )
        verdict = watch.check()
        if verdict.kind == "done":
            out(f"Training done: {verdict.detail}")
            return restarts.read_restarts(run)
        if verdict.kind in ("failed", "stalled"):
            raise TrainingFailed(f"{verdict.detail}\n{watch.tail_text()}")
        if verdict.kind == "lost":
            losses += 1
            if losses > cfg.train.max_restarts:
                raise TrainingFailed(f"{verdict.detail}, after train.max_restarts={cfg.train.max_restarts} restarts.")
            status = read_status(run)
            restarts.record_restart(
                run, cause=verdict.detail, node=name, try_number=1, step=status["step"] if status else 0
            )
            out(f"Restart {losses}: {verdict.detail}. A new node, and a new trainer from the last checkpoint.")
            job, connect = start_on(ready_node())
            continue
        status = own_status(job, read_status(run))
        if status is not None and time.monotonic() - said >= cfg.train.progress_log_s:
            out(f"Training: {progress_line(status)}")
            said = time.monotonic()
        if preempt_after is not None and not preempted and status is not None and status["step"] >= preempt_after:
            out(f"--preempt-after {preempt_after}: deleting TPU VM {name} at step {status['step']}, as Spot may.")
            tpu.delete_node(cfg.tpu, name, api=api)
            preempted = True
        time.sleep(cfg.train.follow_poll_s)
