"""The driver's one decision: from what is known now about the run's node and its trainer, what to do next.
create_tpu_vm, train and the smoke command gather the facts and carry the answer out (deferring or sleeping).

    node, error = tpu.node_now(cfg.tpu, name, operation)     # the node, or its queued request, and why it failed
    action = decide(gather(cfg, run_id, node, node_error=error, job=job, watch=watch, restarts=1))
    action.kind, action.why   # ensure_node | ... | fail; a restart's cause (restarts.json) or a failure's message

The table, case by case: docs/operations.md#durable-training-what-survives-what.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mlm_tasks.errors import NO_RETRY_EXIT
from mlm_tasks.job.follow import JobWatch, Verdict, classify
from mlm_tasks.job.launch import Probe
from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu.calls import capacity

if TYPE_CHECKING:
    from mlm_tasks.config import PipelineConfig

Kind = Literal["ensure_node", "wait", "start", "reattach", "restart", "done", "fail"]


@dataclass(frozen=True)
class Facts:
    node: str  # the node's state (READY, CREATING, PREEMPTED, NOT_FOUND, QUEUED (...)), or TIMEOUT
    now: float
    deadline: float = math.inf  # the training's (train.timeout_hours from this try sequence's first start)
    job: TrainJob | None = None  # the stored trainer's handle
    verdict: Verdict | None = None  # the stored trainer, checked (None: not checked, or no handle)
    replaced: bool = False  # the READY node is not the one the stored trainer ran on
    node_error: str | None = None  # why the node's create failed ("... (code N)")
    rechecked: bool = False  # an ended trainer on a READY node was asked about again after a wait
    try_number: int = 1  # the Airflow try deciding (a trainer of an earlier try that ended: its end was that try's)
    restarts: int = 0
    max_restarts: int = 10  # train.max_restarts
    zone: str = ""
    stockout_until: float | None = None  # a stockout being waited out: until then
    stockout_wait_s: float = 0.0  # tpu.stockout_wait_hours, in seconds
    retry_s: float = 60.0  # the pause between creates while capacity is waited for


@dataclass(frozen=True)
class Action:
    kind: Kind
    why: str
    retry: bool = True  # fail: whether an Airflow retry can help
    stop: bool = False  # stop the stored trainer first
    delete: bool = False  # delete what a failed create left first (billed while it existed)
    wait_for: Literal["node", "recheck", "capacity"] = "node"
    until: float | None = None  # wait_for="capacity": until when capacity is waited for
    about: Literal["node", "trainer", "deadline", "budget"] = "node"  # fail: what failed (the trainer: its log helps)
    advice: str = ""  # fail: what to do, after the trainer's log


def gather(
    cfg: PipelineConfig,
    run_id: str,
    node: tpu.NodeState,
    *,
    job: TrainJob | None = None,
    verdict: Verdict | None = None,
    watch: Callable[[TrainJob], JobWatch | None] | None = None,
    **facts: Any,
) -> Facts:
    """decide's facts (`facts`: the rest of them, e.g. node_error, deadline, restarts): the stored trainer is
    checked by `watch(job)` over SSH on a READY node, else by its status record."""
    replaced = False
    if job is not None and node.ready:
        host = tpu.worker_endpoints(node, external=cfg.tpu.ssh_via == "external")[0]
        was = job.get("node_created")
        replaced = (job["node"], job["host"]) != (node.name, host) or bool(node.created and was and node.created != was)
        if verdict is None and not replaced and watch is not None and (checker := watch(job)) is not None:
            verdict = checker.check()
    elif job is not None and verdict is None:  # no SSH to a node that is not READY: the record tells
        status = read_status(RunPaths(cfg.output_root, run_id))
        verdict = classify(job, status, Probe(None), now=time.time(), stall_s=cfg.train.stall_minutes * 60)
    return Facts(
        node=node.state,
        now=time.time(),
        job=job,
        verdict=verdict,
        replaced=replaced,
        max_restarts=cfg.train.max_restarts,
        zone=cfg.tpu.zone,
        stockout_wait_s=cfg.tpu.stockout_wait_hours * 3600,
        retry_s=cfg.tpu.stockout_retry_s,
        **facts,
    )


def decide(f: Facts) -> Action:
    """The next thing to do; see the module docstring."""
    if f.now >= f.deadline:
        return Action(
            "fail", "The training reached its deadline", retry=False, stop=f.job is not None, about="deadline"
        )
    if f.node_error or f.node == "TIMEOUT":
        return _create_failed(f)
    if tpu.passing(f.node):
        return Action("wait", f"the TPU VM is {f.node}")
    if f.job is not None and (f.node != "READY" or f.replaced):
        return _restart(f, _lost(f))
    if f.node != "READY":
        return Action("ensure_node", f"the TPU VM is {f.node}")
    if f.job is None or f.verdict is None:
        return Action("start", "no trainer runs on the READY node")
    verdict = f.verdict
    if verdict.kind in ("starting", "running"):
        return Action("reattach", verdict.detail)
    if verdict.kind == "done":
        return Action("done", verdict.detail)
    if verdict.kind == "lost":  # a checkpoint at a notice (maintenance, a preemption the node survived)
        return _restart(f, verdict.detail)  # in whichever try's trainer heard it: a retry may have reattached to it
    if f.job["try_number"] < f.try_number:  # a retry: the end of an earlier try's trainer failed that try
        how = "alive but stale" if verdict.kind == "stalled" else "ended"
        why = f"The stored trainer is {how} ({verdict.detail}): a new one starts from the last checkpoint"
        return Action("start", why, stop=verdict.kind == "stalled")
    if not f.rechecked:  # the node may be on its way to PREEMPTED: its word first
        return Action("wait", f"{verdict.detail}; its node is READY: asking it again", wait_for="recheck")
    if verdict.kind == "stalled":
        advice = "The trainer was stopped; a retry starts a new one from the last checkpoint."
        return Action("fail", f"Watchdog: {verdict.detail}.", stop=True, about="trainer", advice=advice)
    why = f"Training failed on TPU VM {f.job['node']}: {verdict.detail}."
    if verdict.exit_code == NO_RETRY_EXIT:
        advice = (
            "Exit code 2 is an error no retry can fix (a bad input, a missing artifact, a refused credential): "
            "act on the message above and trigger a new run."
        )
        return Action("fail", why, retry=False, about="trainer", advice=advice)
    return Action("fail", why, about="trainer", advice="A retry starts a new trainer from the last checkpoint.")


def _lost(f: Facts) -> str:
    job = f.job
    assert job is not None
    who = f"the trainer (pid {job['pid']}, try {job['try_number']}) on {job['node']}"
    if f.replaced:
        cause = f"{who} ran on a node since replaced (another createTime or address): it is lost with it"
    else:
        hint = "" if f.node in ("PREEMPTED", "TERMINATED") else " (preempted?)"
        cause = f"the TPU VM {job['node']} is {f.node}{hint}: {who} is lost with it"
    ended = f.verdict is not None and f.verdict.kind in ("failed", "stalled", "lost")
    return f"{cause} (the trainer's last word: {f.verdict.detail})" if ended and f.verdict else cause


def _restart(f: Facts, cause: str) -> Action:
    if f.restarts >= f.max_restarts:
        return Action(
            "fail",
            f"Training lost its node again ({cause}) after train.max_restarts={f.max_restarts} restarts. This try "
            "fails; an Airflow retry starts a new trainer from the last checkpoint. Raise train.max_restarts for "
            "capacity that is preempted this often.",
            about="budget",
        )
    return Action("restart", cause)


def _create_failed(f: Facts) -> Action:
    error = f.node_error or "not READY in time"
    kind = capacity(f.node_error)
    region = f.zone.rsplit("-", 1)[0]
    if kind == "quota":
        quota = re.search(r"'([^']+)'", error)
        return Action(
            "fail",
            f"The TPU API refused the node for quota {quota.group(1) if quota else '(unnamed)'} in region {region} "
            f"({error}). Waiting does not raise a quota: request more in the Cloud console (IAM & Admin > Quotas, "
            "service tpu.googleapis.com), or pick another tpu.zone or tpu.accelerator_type.",
            retry=False,
            delete=True,
        )
    if kind == "preempted":  # Spot capacity taken back before the node was READY: a new node, no trainer lost
        return Action("ensure_node", f"the Spot node was preempted before it was READY ({error}): a replacement")
    if kind in ("stockout", "reserved") and f.stockout_wait_s > 0:
        until = f.stockout_until or f.now + f.stockout_wait_s
        if f.now + f.retry_s < until:
            return Action("wait", error, delete=True, wait_for="capacity", until=until)
    return Action("fail", error, delete=True)
