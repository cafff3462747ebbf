"""What a detached trainer's state means, as a pure function of (handle, status record, probe, node
state, clock), and the check and reattach built on it, which the train task and its trigger run.

    verdict = classify(job, read_status(run), probe, now=time.time(), stall_s=cfg.train.stall_minutes * 60)
    verdict.kind    # starting | running | done | failed | stalled | lost (its node is gone)
    watch = JobWatch(DetachedJob(job, connect), cfg.tpu, output_root=cfg.output_root, stall_s=..., log=log)
    watch.check()                                   # one look: probe, record, node state -> classify
    reattach(watch, node=name, host=host, created=t)  # a retry: follow this job on? (stops a stale one)

The follow loop waits on starting/running, succeeds on done and fails on failed (with the exit code) or
stalled (after stopping the trainer: a retry may fix it); lost (the node is not READY: preempted, deleted)
is a restart inside the try (mlm_tasks/training/restarts.py), not a failure. A retry that finds a handle reattaches to a
starting/running trainer, succeeds on done, stops a stalled one and starts a new one otherwise. The
status record belongs to the job when it names the job's try (MLM_TRY_NUMBER) and counts more
starts than the record found before the job began: a record left by an earlier trainer is not this
one's progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob, TrainStatus
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu.job import DetachedJob, Log, Probe
from mlm_tasks.training.status import read_status, stalled

if TYPE_CHECKING:
    from mlm_tasks.config import TpuConfig

Kind = Literal["starting", "running", "done", "failed", "stalled", "lost"]


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    detail: str
    exit_code: int | None = None


def own_status(job: TrainJob, status: TrainStatus | None) -> TrainStatus | None:
    """The status record when this job wrote it, else None: its try's, and counting a start more than
    the record before the job began (a trainer that finds the run finished writes none)."""
    if status is None or status.get("try_number") != job["try_number"]:
        return None
    return status if status["starts"] > job.get("starts_before", 0) else None


def status_unfinished(status: TrainStatus | None) -> bool:
    return status is None or status["state"] == "running"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, _ = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds) % 60:02d}s"


def progress_line(status: TrainStatus) -> str:
    loss = "?" if status["last_loss"] is None else f"{status['last_loss']:.4f}"
    speed = "?" if status["tokens_per_s"] is None else f"{status['tokens_per_s']:.0f}"
    return f"step {status['step']}/{status['total_steps']}, loss {loss}, {speed} tokens/s, ETA {_eta(status['eta_s'])}"


def classify(
    job: TrainJob,
    status: TrainStatus | None,
    probe: Probe,
    *,
    now: float,
    stall_s: float,
    node_state: str | None = None,
) -> Verdict:
    """What the job's state means (the follow loop fails on failed/stalled; a retry reattaches to
    starting/running, restarts a stalled one and starts a new one when failed)."""
    who = f"the trainer (pid {job['pid']}, try {job['try_number']}) on {job['node']}"
    mine = own_status(job, status)
    if mine is not None and mine["state"] == "done":
        return Verdict("done", f"{who} finished: {progress_line(mine)}", 0)
    if mine is not None and mine["state"] == "preempted":  # saved a checkpoint on the notice: resume there
        return Verdict("lost", f"{who} stopped on a preemption notice: {mine['error']}", mine["exit_code"])
    if mine is not None and mine["state"] == "failed":
        return Verdict("failed", f"{who} failed: {mine['error']}", mine["exit_code"])
    if node_state not in (None, "READY"):
        hint = "" if node_state == "PREEMPTED" else " (preempted?)"
        return Verdict("lost", f"the TPU VM {job['node']} is {node_state}{hint}: {who} is lost with it")
    if probe.alive is False:
        if probe.exit_code == 0:
            return Verdict("done", f"{who} exited with code 0", 0)
        how = (
            f"exited with code {probe.exit_code}"
            if probe.exit_code is not None
            else "is gone without an exit code (killed: SIGKILL, the OOM killer, a reboot of the VM)"
        )
        return Verdict("failed", f"{who} {how}", probe.exit_code)
    if mine is None:
        waited = now - job["started_at"]
        if waited > stall_s:
            return Verdict(
                "stalled",
                f"{who} has written no status record {waited:.0f}s after its start "
                f"(train.stall_minutes is {stall_s / 60:g})",
            )
        return Verdict("starting", f"{who} is starting ({waited:.0f}s since its start, no status record yet)")
    why = stalled(mine, stall_s, now)
    if why is not None:
        return Verdict("stalled", why)
    return Verdict("running", progress_line(mine))


class JobWatch:
    """The detached trainer as its driver follows it: one check, a stop, its log's last lines. The status
    record is read from `output_root`; the node's state is asked of the TPU API only when SSH is silent."""

    def __init__(self, vm: DetachedJob, tpu_cfg: TpuConfig, *, output_root: str, stall_s: float, log: Log) -> None:
        self.vm, self.job, self.tpu_cfg, self.log = vm, vm.job, tpu_cfg, log
        self.output_root, self.stall_s = output_root, stall_s

    def check(self) -> Verdict:
        # The probe first, then the record: a trainer that finishes between the two is read as done.
        probe = self.vm.probe()
        status = read_status(RunPaths(self.output_root, self.job["run_id"]))
        node_state = None
        if probe.alive is None:  # no SSH answer: a preempted node explains it at once
            node_state = tpu.get_state(self.tpu_cfg, self.job["node"]).state
            self.log.warning("No answer from worker 0 (%s); the node is %s.", probe.error, node_state)
        elif probe.alive is False and status_unfinished(status):
            # Gone before its record says it ended: killed, or its VM is being preempted (the processes go
            # before SSH does), which the node's state tells.
            node_state = tpu.get_state(self.tpu_cfg, self.job["node"]).state
        return classify(self.job, status, probe, now=time.time(), stall_s=self.stall_s, node_state=node_state)

    def stop(self) -> Probe:
        return self.vm.stop(self.log)

    def tail_text(self) -> str:
        return self.vm.tail_text()


class NodeLost(RuntimeError):
    """reattach found the stored job's node not READY, or replaced: lost with it; the caller restarts it."""


def _utc(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp)) if stamp else "at an unknown time"


def reattach(watch: JobWatch, *, node: str, host: str, created: float | None = None) -> bool:
    """Whether a retry follows the stored job on (it runs, or it is done) rather than start a new one. A stale
    one is stopped first. A node lost since it was found READY (preempted between the two calls), or replaced
    since the job started on it, raises NodeLost: the job is gone with it, a restart the caller counts."""
    job, log = watch.job, watch.log
    # A node replaced under the same name may get the same address: its createTime tells them apart.
    was_created = job.get("node_created")
    if (job["node"], job["host"]) != (node, host) or (created and was_created and created != was_created):
        raise NodeLost(
            f"the trainer (pid {job['pid']}, try {job['try_number']}) ran on {job['node']} ({job['host']}, created "
            f"{_utc(was_created)}), which was replaced by {node} ({host}, created {_utc(created)}): it is lost with it"
        )
    began = time.monotonic()
    verdict = watch.check()
    if verdict.kind in ("starting", "running"):
        log.info(
            "Reattached to %s in %.2fs: %s. No second trainer is started.",
            f"the trainer of try {job['try_number']} (pid {job['pid']})",
            time.monotonic() - began,
            verdict.detail,
        )
        return True
    if verdict.kind == "done":
        log.info("The stored trainer already finished: %s.", verdict.detail)
        return True
    if verdict.kind == "lost" and verdict.exit_code is not None:
        # It saved a checkpoint on a preemption notice and exited (75), and its node is READY (a maintenance
        # event, or a notice the VM survived): nothing is lost, a new trainer resumes at that step. Taken
        # for a lost node, every restart would find the same record and restart again, to max_restarts.
        log.warning("%s; its node is READY: starting a new trainer from that checkpoint.", verdict.detail)
        return False
    if verdict.kind == "lost":
        raise NodeLost(verdict.detail)
    if verdict.kind == "stalled":
        log.warning(
            "The stored trainer is alive but stale (%s): stopping it, then starting a new one "
            "from the last checkpoint.",
            verdict.detail,
        )
        watch.stop()
    else:
        log.warning("The stored trainer ended (%s): starting a new one from the last checkpoint.", verdict.detail)
    return False
