"""The trainer as a job of the TPU VM, not a child of an SSH session: the shell the train task runs
over short SSH calls to start, probe and stop it (what the answers mean: mlm_tasks/model/follow.py).

    line = remote_command(cfg, "train", run_id, node=name, detach_log=log_name(run_id, try_number), ...)
    job = started_job(outcome.tail, node=name, host=host, ...)      # the handle: pid, log, try
    probe = parse_probe(run(probe_command(job)).tail)                # alive? else its exit code
    run(stop_command(job))                                           # SIGTERM+SIGCONT, then SIGKILL, the group
    run(tail_command(job))                                           # the last lines of its log

A job is alive while its pid runs and holds the run lock on fd 9 (`bundle._run_lock`): a recycled pid,
or a zombie, is not it.
"""
from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from mlm_tasks.results import TrainJob
from mlm_tasks.tpu.bundle import JOB_MARK, STOP_GRACE_S, exit_file, run_lock_name, shell_path

PROBE_MARK = "MLM_PROBE"


def log_name(run_id: str, try_number: int) -> str:
    """The trainer's log file of one try, relative to tpu.workdir (a hash: a run id may hold any character)."""
    return f"logs/train-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}-try{try_number}.log"


def started_job(lines: Iterable[str], *, node: str, host: str, try_number: int, log: str, workdir: str,
                run_id: str, now: float, starts_before: int) -> TrainJob | None:
    """The handle from a detached start's output (None: the line printed no JOB_MARK, so nothing started)."""
    for line in lines:
        found = re.fullmatch(rf"{JOB_MARK} pid=(\d+)", line.strip())
        if found:
            return TrainJob(node=node, host=host, worker=0, pid=int(found.group(1)), try_number=try_number,
                            log=log, workdir=workdir, run_id=run_id, started_at=now, starts_before=starts_before)
    return None


def _cd(job: TrainJob) -> str:
    return f"cd {shell_path(job['workdir'])}"


def _holds_lock(job: TrainJob) -> str:
    """Shell test: the job's pid runs and holds the run lock (so it is our trainer, not a recycled pid)."""
    lock = shlex.quote(run_lock_name(job["run_id"], "train"))
    pid = int(job["pid"])
    return (f'{{ kill -0 {pid} 2>/dev/null && [ "$(stat -L -c %d:%i /proc/{pid}/fd/9 2>/dev/null)" = '
            f'"$(stat -c %d:%i {lock} 2>/dev/null)" ]; }}')


def _answer(job: TrainJob) -> str:
    code = shlex.quote(exit_file(job["log"]))
    return (f"if {_holds_lock(job)}; then echo {PROBE_MARK} alive; "
            f'else echo "{PROBE_MARK} gone $(cat {code} 2>/dev/null || echo -)"; fi')


def probe_command(job: TrainJob) -> str:
    """Prints `MLM_PROBE alive`, or `MLM_PROBE gone <exit code, or - when it left none>`."""
    return f"{_cd(job)} && {_answer(job)}"


@dataclass(frozen=True)
class Probe:
    alive: bool | None            # None: the probe itself failed (SSH down): only the status record tells
    exit_code: int | None = None  # of a gone job, when its wrapper recorded one
    error: str | None = None


def parse_probe(lines: Iterable[str], error: str | None = None) -> Probe:
    for line in lines:
        found = re.fullmatch(rf"{PROBE_MARK} (alive|gone)(?: (-|\d+))?", line.strip())
        if found:
            if found.group(1) == "alive":
                return Probe(True)
            code = found.group(2)
            return Probe(False, int(code) if code and code != "-" else None)
    return Probe(None, error=error or "the probe printed no answer")


def stop_command(job: TrainJob, grace_s: int = STOP_GRACE_S) -> str:
    """Stops the job's process group: SIGTERM (and SIGCONT, so a frozen trainer gets it), then SIGKILL
    after grace_s. Prints `MLM_PROBE gone ...` once it is gone."""
    pid = int(job["pid"])
    ticks = max(1, int(grace_s * 5))
    return (f"{_cd(job)} && if {_holds_lock(job)}; then "
            f"kill -s TERM -- -{pid} 2>/dev/null || kill -s TERM {pid} 2>/dev/null || true; "
            f"kill -s CONT -- -{pid} 2>/dev/null || true; i=0; "
            f"while {_holds_lock(job)} && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done; "
            f"if {_holds_lock(job)}; then echo \"pid {pid} still runs after {grace_s}s: SIGKILL.\"; "
            f"kill -s KILL -- -{pid} 2>/dev/null || kill -s KILL {pid} 2>/dev/null || true; sleep 0.5; fi; fi; "
            + _answer(job))


def tail_command(job: TrainJob, lines: int = 40) -> str:
    return f"{_cd(job)} && tail -n {int(lines)} {shlex.quote(job['log'])}"
