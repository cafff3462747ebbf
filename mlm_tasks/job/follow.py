"""What a detached trainer's state means (a pure function), and the check built on it.

verdict = classify(job, read_status(run), probe, now=time.time(), stall_s=cfg.train.stall_minutes * 60)
verdict.kind    # starting | running | done | failed | stalled | lost (its node is gone, or a notice)
JobWatch(DetachedJob(job, connect), cfg.tpu, output_root=..., stall_s=..., log=log).check()
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from mlm_tasks.job.launch import DetachedJob, Log, Probe
from mlm_tasks.job.status import read_status, stalled
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob, TrainStatus
from mlm_tasks.tpu import api as tpu

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
    """What the job's state means; a node that is not READY (node_state) is its end, whatever the record says."""
    who = f"the trainer (pid {job['pid']}, try {job['try_number']}) on {job['node']}"
    mine = own_status(job, status)
    if mine is not None and mine["state"] == "done":
        return Verdict("done", f"{who} finished: {progress_line(mine)}", 0)
    if node_state not in (None, "READY"):  # the node's word first: whatever the trainer recorded as it went
        hint = "" if node_state == "PREEMPTED" else " (preempted?)"
        said = f" (it recorded {mine['state']}: {mine['error']})" if mine is not None and mine["error"] else ""
        return Verdict("lost", f"the TPU VM {job['node']} is {node_state}{hint}: {who} is lost with it{said}")
    if mine is not None and mine["state"] == "preempted":  # saved a checkpoint on the notice: resume there
        return Verdict("lost", f"{who} stopped on a preemption notice: {mine['error']}", mine["exit_code"])
    if mine is not None and mine["state"] == "failed":
        return Verdict("failed", f"{who} failed: {mine['error']}", mine["exit_code"])
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
    """The detached trainer as its driver follows it: one check, a stop, its log's last lines."""

    def __init__(self, vm: DetachedJob, tpu_cfg: TpuConfig, *, output_root: str, stall_s: float, log: Log) -> None:
        self.vm, self.job, self.tpu_cfg, self.log = vm, vm.job, tpu_cfg, log
        self.output_root, self.stall_s = output_root, stall_s

    def check(self) -> Verdict:
        # The probe first, then the record: a trainer that finishes between the two is read as done.
        probe = self.vm.probe()
        status = read_status(RunPaths(self.output_root, self.job["run_id"]))
        mine, node_state = own_status(self.job, status), None
        if probe.alive is None:  # no SSH answer: a preempted node explains it at once
            node_state = tpu.get_state(self.tpu_cfg, self.job["node"]).state
            self.log.warning("No answer from worker 0 (%s); the node is %s.", probe.error, node_state)
        elif probe.alive is False and probe.exit_code != 0 and not (mine and mine["state"] == "done"):
            # Ended, not done: a VM being preempted loses its processes before SSH: the node's word first.
            node_state = tpu.get_state(self.tpu_cfg, self.job["node"]).state
        return classify(self.job, status, probe, now=time.time(), stall_s=self.stall_s, node_state=node_state)

    def stop(self) -> Probe:
        return self.vm.stop(self.log)

    def tail_text(self) -> str:
        return self.vm.tail_text()
