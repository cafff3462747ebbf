"""The trainer as a job of the TPU VM, not of an SSH session: started, probed, stopped and tailed over SSH;
alive while its pid runs and holds the run lock on fd 9 (a recycled pid, or a zombie, is not it).

    outcome, job = start(ssh.Session(connect, host), line, node=name, host=host, try_number=n, ...)  # pid, log
    vm = DetachedJob(job, connect)          # one short session per call
    vm.probe(); vm.stop(log); vm.tail_text()
"""

from __future__ import annotations

import hashlib
import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from mlm_tasks.job.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import ssh
from mlm_tasks.tpu.bundle import JOB_MARK, STOP_GRACE_S, exit_file, run_lock_name, shell_path

PROBE_MARK = "MLM_PROBE"
TAIL_LINES = 40
# A probe, stop or tail prints within a second; no output for this long is a connection gone half-open.
CHECK_IDLE_S = 60.0


class Log(Protocol):
    """Where a driver's lines go: the task's or the trigger's logger (so they land in the task log)."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...


def log_name(run_id: str, try_number: int) -> str:
    """The trainer's log file of one try, relative to tpu.workdir (a hash: a run id may hold any character)."""
    return f"logs/train-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}-try{try_number}.log"


def job_handle(stored: object) -> TrainJob | None:
    """A handle as a store gives it back (JSON), or None when there is none. Only the pid is required: an
    older try's handle may lack a later field."""
    return cast(TrainJob, stored) if isinstance(stored, dict) and "pid" in stored else None


def start(
    session: ssh.Session,
    command: str,
    *,
    secret: tuple[str, str] | None,
    node: str,
    node_created: float | None,
    host: str,
    try_number: int,
    workdir: str,
    output_root: str,
    run_id: str,
) -> tuple[ssh.Outcome, TrainJob | None]:
    """Runs the detached start line (`remote_command(..., detach_log=log_name(run_id, try_number))`) in
    `session`: its outcome, and the job's handle (None: nothing was started). The handle counts the status
    record's starts before it, so that its own record is known."""
    before = read_status(RunPaths(output_root, run_id))
    now = time.time()
    outcome = session.run(command, secret=secret)
    for line in outcome.tail if outcome.exit_code == 0 else ():
        found = re.fullmatch(rf"{JOB_MARK} pid=(\d+)", line.strip())
        if found:
            return outcome, TrainJob(
                node=node,
                node_created=node_created,
                host=host,
                worker=0,
                pid=int(found.group(1)),
                try_number=try_number,
                log=log_name(run_id, try_number),
                workdir=workdir,
                run_id=run_id,
                started_at=now,
                starts_before=before["starts"] if before else 0,
            )
    return outcome, None


def _cd(job: TrainJob) -> str:
    return f"cd {shell_path(job['workdir'])}"


def _holds_lock(job: TrainJob) -> str:
    """Shell test: the job's pid runs and holds the run lock (so it is our trainer, not a recycled pid)."""
    lock = shlex.quote(run_lock_name(job["run_id"], "train"))
    pid = int(job["pid"])
    return (
        f'{{ kill -0 {pid} 2>/dev/null && [ "$(stat -L -c %d:%i /proc/{pid}/fd/9 2>/dev/null)" = '
        f'"$(stat -c %d:%i {lock} 2>/dev/null)" ]; }}'
    )


def _answer(job: TrainJob) -> str:
    """Prints `MLM_PROBE alive`, or `MLM_PROBE gone <exit code, or - when it left none>`."""
    code = shlex.quote(exit_file(job["log"]))
    return (
        f"if {_holds_lock(job)}; then echo {PROBE_MARK} alive; "
        f'else echo "{PROBE_MARK} gone $(cat {code} 2>/dev/null || echo -)"; fi'
    )


@dataclass(frozen=True)
class Probe:
    alive: bool | None  # None: the probe itself failed (SSH down): only the status record tells
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
    return (
        f"{_cd(job)} && if {_holds_lock(job)}; then "
        f"kill -s TERM -- -{pid} 2>/dev/null || kill -s TERM {pid} 2>/dev/null || true; "
        f"kill -s CONT -- -{pid} 2>/dev/null || true; i=0; "
        f"while {_holds_lock(job)} && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done; "
        f'if {_holds_lock(job)}; then echo "pid {pid} still runs after {grace_s}s: SIGKILL."; '
        f"kill -s KILL -- -{pid} 2>/dev/null || kill -s KILL {pid} 2>/dev/null || true; sleep 0.5; fi; fi; "
        + _answer(job)
    )


class DetachedJob:
    """A started job and the login to its worker 0: each call is one short SSH session."""

    def __init__(self, job: TrainJob, connect: ssh.Connect) -> None:
        self.job = job
        self.connect = connect

    def _short(self, command: str) -> ssh.Outcome:
        return ssh.Session(self.connect, self.job["host"], idle_timeout_s=CHECK_IDLE_S).run(command)

    def probe(self) -> Probe:
        outcome = self._short(f"{_cd(self.job)} && {_answer(self.job)}")
        return parse_probe(outcome.tail, outcome.error)

    def stop(self, log: Log) -> Probe:
        """Stops the job's process group (SIGTERM, SIGCONT, then SIGKILL) and says whether it is gone."""
        log.info("Stopping the trainer (pid %d, its process group) on %s.", self.job["pid"], self.job["node"])
        outcome = self._short(stop_command(self.job))
        for line in outcome.tail:
            log.info("[worker 0] %s", line)
        return parse_probe(outcome.tail, outcome.error)

    def tail_text(self, lines: int = TAIL_LINES) -> str:
        """The last lines of the job's log, as a task's message shows them."""
        outcome = self._short(f"{_cd(self.job)} && tail -n {int(lines)} {shlex.quote(self.job['log'])}")
        text = "\n    ".join(outcome.tail) or (f"(none: {outcome.error})" if outcome.error else "(empty)")
        return f"Last lines of {self.job['workdir']}/{self.job['log']} on worker 0:\n    {text}"
