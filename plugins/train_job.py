"""The train task on a TPU VM: the trainer runs as a detached job on worker 0, which the task starts
(or finds again), then follows over short SSH calls until it ends.

    remote = DetachedTrain("train", log, args=[...], session_env={...})   # what TrainOperator composes
    remote.start(context, cfg, replace)    # as RemoteStep: replaces a dead node first, then run()

`run` reads the job handle from the task state store (`context["task_state_store"]`, key JOB_KEY).
A handle whose trainer is alive and beating is reattached to: no second start, no lost step. A
trainer that is gone (or a handle of a node since replaced) is followed by a new start, which resumes
from the last checkpoint; one that is alive but stale is stopped first (its process group: SIGTERM,
SIGCONT, then SIGKILL). A new start runs the detached line of `remote_command` (the run lock, the
install, then setsid/nohup with the output in `<workdir>/logs/`), stores the handle, and returns.

The follow loop, every train.follow_poll_s: probe the job (`kill -0` and its hold on the run lock,
over a fresh SSH session), read the status record from output_root, and `classify` (mlm_tasks/model/follow.py,
pure, so a trigger can run the same loop). It logs progress every train.progress_log_s, succeeds when
the status says done, fails with the exit code and the last lines of the trainer's log when it failed
or died (exit 2 without retries), and fails the try when it stalled for train.stall_minutes (the
watchdog), stopping the trainer first. `stop()` (on_kill: the task marked failed, cleared, timed out)
stops the trainer over SSH. What this does not do yet: free the worker slot (the task polls; a
deferral to a trigger is the next step), and it cannot see a task runner killed without on_kill: then
the trainer goes on, and the next try reattaches.
"""
from __future__ import annotations

import os
import time
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_tasks.errors import NO_RETRY_EXIT
from mlm_tasks.model.follow import Verdict, classify
from mlm_tasks.model.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import job as vm_job
from mlm_tasks.tpu import ssh
from remote_step import RemoteStep

JOB_KEY = "train_job"
TAIL_LINES = 40


def try_number(context: Any) -> int:
    """The Airflow try running this code (1 outside Airflow)."""
    ti = context.get("ti")
    number = getattr(ti, "try_number", None) or os.environ.get("AIRFLOW_CTX_TRY_NUMBER", "")
    return int(number) if str(number).isdigit() else 1


class DetachedTrain(RemoteStep):
    """RemoteStep whose step is a job on the VM: see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job: TrainJob | None = None
        self._connect: ssh.Connect | None = None
        self._cfg: Any = None

    def run(self, context: Any, cfg: Any, node: tpu.NodeState) -> dict[str, Any]:
        name, hosts, connect = self.connect_to(context, cfg, node)
        self._connect, self._cfg = connect, cfg
        store = context.get("task_state_store")
        job = self._resume(cfg, store.get(JOB_KEY) if store is not None else None, name, hosts[0])
        if job is None:
            job = self._start(context, cfg, name, hosts[0])
            if store is not None:
                store.set(JOB_KEY, dict(job))
        self.job = job
        self._follow(cfg, job)
        return {"node": name, "workers": len(hosts)}

    def _resume(self, cfg: Any, stored: Any, name: str, host: str) -> TrainJob | None:
        """The stored job when it can be followed on (reattached), else None (stopping a stale one)."""
        if not isinstance(stored, dict) or "pid" not in stored:
            return None
        job: TrainJob = stored  # type: ignore[assignment]
        if (job["node"], job["host"]) != (name, host):
            self.log.warning("The stored trainer ran on %s (%s), this try finds %s (%s): the node was replaced, "
                             "its trainer is gone with it. Starting a new one.", job["node"], job["host"], name, host)
            return None
        began = time.monotonic()
        verdict = self._check(cfg, job)
        if verdict.kind in ("starting", "running"):
            self.log.info("Reattached to %s in %.2fs: %s. No second trainer is started.",
                          f"the trainer of try {job['try_number']} (pid {job['pid']})", time.monotonic() - began,
                          verdict.detail)
            return job
        if verdict.kind == "done":
            self.log.info("The stored trainer already finished: %s.", verdict.detail)
            return job
        if verdict.kind == "stalled":
            self.log.warning("The stored trainer is alive but stale (%s): stopping it, then starting a new one "
                             "from the last checkpoint.", verdict.detail)
            self._stop(job)
        else:
            self.log.warning("The stored trainer ended (%s): starting a new one from the last checkpoint.",
                             verdict.detail)
        return None

    def _start(self, context: Any, cfg: Any, name: str, host: str) -> TrainJob:
        number = try_number(context)
        log_name = vm_job.log_name(context["run_id"], number)
        command = self.command or self.remote_line(context, cfg, name, detach_log=log_name,
                                                   env={"MLM_TRY_NUMBER": str(number)})
        self.log.info("Starting the trainer detached on worker 0 of %s (try %d); its output goes to %s/%s.",
                      name, number, cfg.tpu.workdir, log_name)
        before = read_status(RunPaths(cfg.output_root, context["run_id"]))  # the new trainer's record counts one more
        self.session = ssh.Session(self._require_connect(), host,
                                   on_line=lambda line: self.log.info("[worker 0] %s", line))
        outcome = self.session.run(command, env=self.session_env)
        if outcome.exit_code != 0:
            raise self.failure(cfg, name, outcome)
        job = vm_job.started_job(outcome.tail, node=name, host=host, try_number=number, log=log_name,
                                 workdir=cfg.tpu.workdir, run_id=context["run_id"], now=time.time(),
                                 starts_before=before["starts"] if before else 0)
        if job is None:
            raise AirflowException(f"The detached start on {name} printed no job id ({outcome.describe()}): "
                                   "retry; if it repeats, run the line by hand on worker 0.")
        self.log.info("Trainer started: pid %d (its process group) on %s.", job["pid"], name)
        return job

    def _follow(self, cfg: Any, job: TrainJob) -> None:
        last_line = 0.0
        while True:
            verdict = self._check(cfg, job)
            if verdict.kind == "done":
                self.log.info("Training done: %s.\n%s", verdict.detail, self._tail_text(job))
                return
            if verdict.kind == "failed":
                raise self._failed(job, verdict)
            if verdict.kind == "stalled":
                self._stop(job)
                raise AirflowException(f"Watchdog: {verdict.detail}. The trainer was stopped; a retry starts a "
                                       "new one from the last checkpoint.\n" + self._tail_text(job))
            if time.monotonic() - last_line >= cfg.train.progress_log_s:
                self.log.info("Training: %s", verdict.detail)
                last_line = time.monotonic()
            time.sleep(cfg.train.follow_poll_s)

    def _check(self, cfg: Any, job: TrainJob) -> Verdict:
        # The probe first, then the record: a trainer that finishes between the two is read as done.
        probe = self._probe(job)
        status = read_status(RunPaths(cfg.output_root, job["run_id"]))
        node_state = None
        if probe.alive is None:  # no SSH answer: a preempted node explains it at once
            node_state = tpu.get_state(cfg.tpu, job["node"]).state
            self.log.warning("No answer from worker 0 (%s); the node is %s.", probe.error, node_state)
        return classify(job, status, probe, now=time.time(), stall_s=cfg.train.stall_minutes * 60,
                        node_state=node_state)

    def _short(self, command: str, job: TrainJob) -> ssh.Outcome:
        return ssh.Session(self._require_connect(), job["host"]).run(command)

    def _probe(self, job: TrainJob) -> vm_job.Probe:
        outcome = self._short(vm_job.probe_command(job), job)
        return vm_job.parse_probe(outcome.tail, outcome.error)

    def _stop(self, job: TrainJob) -> vm_job.Probe:
        self.log.info("Stopping the trainer (pid %d, its process group) on %s.", job["pid"], job["node"])
        outcome = self._short(vm_job.stop_command(job), job)
        for line in outcome.tail:
            self.log.info("[worker 0] %s", line)
        return vm_job.parse_probe(outcome.tail, outcome.error)

    def _tail_text(self, job: TrainJob, lines: int = TAIL_LINES) -> str:
        outcome = self._short(vm_job.tail_command(job, lines), job)
        lines = "\n    ".join(outcome.tail) or "(empty)"
        return f"Last lines of {job['workdir']}/{job['log']} on worker 0:\n    {lines}"

    def _failed(self, job: TrainJob, verdict: Verdict) -> AirflowException:
        message = f"Training failed on TPU VM {job['node']}: {verdict.detail}.\n{self._tail_text(job)}"
        if verdict.exit_code == NO_RETRY_EXIT:
            return AirflowFailException(message + "\nExit code 2 is an error no retry can fix (a bad input, a "
                                        "missing artifact, a refused credential): act on the message above and "
                                        "trigger a new run.")
        return AirflowException(message + "\nA retry starts a new trainer from the last checkpoint.")

    def _require_connect(self) -> ssh.Connect:
        if self._connect is None:
            raise AirflowException("No SSH login to worker 0 yet: the node was not checked.")
        return self._connect

    def close(self) -> None:
        """on_kill: stop the trainer (the task was marked failed, cleared or timed out), then hang up."""
        if self.job is not None and self._connect is not None:
            probe = self._stop(self.job)
            self.log.info("Task killed: the trainer is %s.", "gone" if probe.alive is False else "maybe still running")
        super().close()
