"""The train task on a TPU VM: the trainer runs as a detached job on worker 0, which the task starts
(or finds again); the task then waits in the triggerer (plugins/mlm_airflow/triggers/train_job.py), not in a
worker slot.

    remote = DetachedTrain("train", log, args=[...], hub_token=token)    # what TrainOperator composes
    job, workers = remote.start(context, cfg, replace)   # as RemoteStep: replaces a dead node, then run()
    watch = JobWatch.connected(cfg, job, log)             # the trigger's and the task's view of the job
    watch.check()                                         # a Verdict: starting | running | done | failed | stalled

`run` reads the job handle from the task state store (`context["task_state_store"]`, key JOB_KEY).
A handle whose trainer is alive and beating is reattached to: no second start, no lost step. A
trainer that is gone (or a handle of a node since replaced) is followed by a new start, which resumes
from the last checkpoint; one that is alive but stale is stopped first (its process group: SIGTERM,
SIGCONT, then SIGKILL). A new start runs the detached line of `remote_command` (the run lock, the
install, then setsid/nohup with the output in `<workdir>/logs/`), stores the handle, and returns it.

One check (`JobWatch.check`): probe the job (`kill -0` and its hold on the run lock, over a fresh SSH
session), read the status record from output_root, ask the TPU API about the node when SSH does not
answer, and `classify` (mlm_tasks/model/follow.py). The trigger repeats it every train.follow_poll_s;
`ended` turns its last verdict into the task's end: done succeeds (with the log's last lines), failed
fails with the exit code and the last lines (exit 2 without retries), stalled (the watchdog) stops the
trainer and fails the try so that a retry starts a new one from the last checkpoint.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import ssh_connect
from mlm_airflow.operators.remote_step import RemoteStep
from mlm_tasks.errors import NO_RETRY_EXIT
from mlm_tasks.model.follow import Verdict, classify
from mlm_tasks.model.status import read_status
from mlm_tasks.paths import RunPaths
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import job as vm_job
from mlm_tasks.tpu import ssh

JOB_KEY = "train_job"
TAIL_LINES = 40
# A check's SSH login is retried this long (the start's: 300 s): a node that does not answer is soon
# asked about at the TPU API instead, which tells a preemption at once.
CHECK_PATIENCE_S = 60.0
# A check's commands print within a second; no output for this long is a connection gone half-open.
CHECK_IDLE_S = 60.0
ON_KILL_STOP_S = 4.0  # Airflow's supervisor SIGKILLs a task 5 s after asking it to stop


def try_number(context: Any) -> int:
    """The Airflow try running this code (1 outside Airflow)."""
    ti = context.get("ti")
    number = getattr(ti, "try_number", None) or os.environ.get("AIRFLOW_CTX_TRY_NUMBER", "")
    return int(number) if str(number).isdigit() else 1


class JobWatch:
    """The detached trainer `job` as seen from Airflow: one check, a stop, its log's last lines."""

    def __init__(self, cfg: Any, job: TrainJob, connect: ssh.Connect, log: Any) -> None:
        self.cfg, self.job, self.connect, self.log = cfg, job, connect, log

    @classmethod
    def connected(cls, cfg: Any, job: TrainJob, log: Any) -> JobWatch:
        """A watch that logs in as the run's SSH connection, pinning the host keys the node published."""
        api = tpu.client(cfg.tpu)
        connect = ssh_connect(cfg.tpu.ssh_conn_id, cfg.tpu.ssh_port, CHECK_PATIENCE_S, node=job["node"],
                              published=tpu.published_keys(cfg.tpu, job["node"], api=api))
        return cls(cfg, job, connect, log)

    def check(self) -> Verdict:
        # The probe first, then the record: a trainer that finishes between the two is read as done.
        job = self.job
        probe = self._probe()
        status = read_status(RunPaths(self.cfg.output_root, job["run_id"]))
        node_state = None
        if probe.alive is None:  # no SSH answer: a preempted node explains it at once
            node_state = tpu.get_state(self.cfg.tpu, job["node"]).state
            self.log.warning("No answer from worker 0 (%s); the node is %s.", probe.error, node_state)
        return classify(job, status, probe, now=time.time(), stall_s=self.cfg.train.stall_minutes * 60,
                        node_state=node_state)

    def _short(self, command: str) -> ssh.Outcome:
        return ssh.Session(self.connect, self.job["host"], idle_timeout_s=CHECK_IDLE_S).run(command)

    def _probe(self) -> vm_job.Probe:
        outcome = self._short(vm_job.probe_command(self.job))
        return vm_job.parse_probe(outcome.tail, outcome.error)

    def stop(self) -> vm_job.Probe:
        """Stops the trainer's process group (SIGTERM, SIGCONT, then SIGKILL) and says whether it is gone."""
        self.log.info("Stopping the trainer (pid %d, its process group) on %s.", self.job["pid"], self.job["node"])
        outcome = self._short(vm_job.stop_command(self.job))
        for line in outcome.tail:
            self.log.info("[worker 0] %s", line)
        return vm_job.parse_probe(outcome.tail, outcome.error)

    def tail_text(self, lines: int = TAIL_LINES) -> str:
        outcome = self._short(vm_job.tail_command(self.job, lines))
        text = "\n    ".join(outcome.tail) or (f"(none: {outcome.error})" if outcome.error else "(empty)")
        return f"Last lines of {self.job['workdir']}/{self.job['log']} on worker 0:\n    {text}"

    def ended(self, verdict: Verdict) -> None:
        """The task's end for a final verdict: returns on done, raises otherwise (stopping a stalled trainer)."""
        if verdict.kind == "done":
            self.log.info("Training done: %s.\n%s", verdict.detail, self.tail_text())
            return
        if verdict.kind == "stalled":
            self.stop()
            raise AirflowException(f"Watchdog: {verdict.detail}. The trainer was stopped; a retry starts a "
                                   "new one from the last checkpoint.\n" + self.tail_text())
        message = f"Training failed on TPU VM {self.job['node']}: {verdict.detail}.\n{self.tail_text()}"
        if verdict.exit_code == NO_RETRY_EXIT:
            raise AirflowFailException(message + "\nExit code 2 is an error no retry can fix (a bad input, a "
                                       "missing artifact, a refused credential): act on the message above and "
                                       "trigger a new run.")
        raise AirflowException(message + "\nA retry starts a new trainer from the last checkpoint.")


class DetachedTrain(RemoteStep):
    """RemoteStep whose step is a job on the VM: `run` returns (job, workers) once it runs; see the module
    docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watch: JobWatch | None = None

    def run(self, context: Any, cfg: Any, node: tpu.NodeState) -> tuple[TrainJob, int]:  # type: ignore[override]
        name, hosts, connect = self.connect_to(context, cfg, node)
        store = context.get("task_state_store")
        job = self._resume(cfg, store.get(JOB_KEY) if store is not None else None, name, hosts[0], connect)
        if job is None:
            job = self._start(context, cfg, name, hosts[0], connect)
            if store is not None:
                store.set(JOB_KEY, dict(job))
        self.watch = JobWatch(cfg, job, connect, self.log)
        return job, len(hosts)

    def _resume(self, cfg: Any, stored: Any, name: str, host: str, connect: ssh.Connect) -> TrainJob | None:
        """The stored job when it can be followed on (reattached), else None (stopping a stale one)."""
        if not isinstance(stored, dict) or "pid" not in stored:
            return None
        job: TrainJob = stored  # type: ignore[assignment]
        if (job["node"], job["host"]) != (name, host):
            self.log.warning("The stored trainer ran on %s (%s), this try finds %s (%s): the node was replaced, "
                             "its trainer is gone with it. Starting a new one.", job["node"], job["host"], name, host)
            return None
        began = time.monotonic()
        watch = JobWatch(cfg, job, connect, self.log)
        verdict = watch.check()
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
            watch.stop()
        else:
            self.log.warning("The stored trainer ended (%s): starting a new one from the last checkpoint.",
                             verdict.detail)
        return None

    def _start(self, context: Any, cfg: Any, name: str, host: str, connect: ssh.Connect) -> TrainJob:
        number = try_number(context)
        log_name = vm_job.log_name(context["run_id"], number)
        command = self.command or self.remote_line(context, cfg, name, detach_log=log_name,
                                                   env={"MLM_TRY_NUMBER": str(number)})
        self.log.info("Starting the trainer detached on worker 0 of %s (try %d); its output goes to %s/%s.",
                      name, number, cfg.tpu.workdir, log_name)
        before = read_status(RunPaths(cfg.output_root, context["run_id"]))  # the new trainer's record counts one more
        self.session = ssh.Session(connect, host, on_line=lambda line: self.log.info("[worker 0] %s", line))
        outcome = self.session.run(command, secret=self.secret())
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

    def close(self) -> None:
        """on_kill before the deferral: stop the trainer (the task was marked failed, cleared or timed out).
        In a thread, bounded: on_kill runs in a signal handler, which may have interrupted this very process
        inside an SSH call (and its locks); Airflow SIGKILLs the task a few seconds later anyway. A stop
        that does not finish in time leaves the trainer to the teardown, which deletes the VM."""
        watch = self.watch
        if watch is not None:
            outcome: list[vm_job.Probe] = []
            stopper = threading.Thread(target=lambda: outcome.append(watch.stop()), daemon=True)
            stopper.start()
            stopper.join(ON_KILL_STOP_S)
            gone = bool(outcome) and outcome[0].alive is False
            self.log.info("Task killed: the trainer is %s.", "gone" if gone else
                          f"maybe still running (no confirmation within {ON_KILL_STOP_S:g}s; the teardown deletes "
                          "the VM)")
        super().close()
