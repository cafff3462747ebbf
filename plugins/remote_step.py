"""Run one pipeline step on the run's TPU VM over SSH (the `compute: tpu_vm` path).

    train = TpuSSHStepOperator(task_id="train", config=cfg, step="train")

The node's workers come from the TPU API (their IPs, internal or external per `tpu.ssh_via`; the
port is `tpu.ssh_port`), the login from the Airflow SSH connection `tpu.ssh_conn_id` (user + private
key). Before the SSH session, port 22 of the worker is probed with a short timeout: a worker Airflow
cannot reach fails the task at once, without retries, naming the fix (firewall rule, external IPs,
ssh_via), instead of waiting out the SSH patience on every try. TensorFlow on TPU is
single-client: on one host the step runs there with `TPUClusterResolver(tpu="local")`; on a
multi-host slice (more than one network endpoint, which needs a `-pod` runtime) it runs on worker 0
only, addressing the whole slice by node name, zone and project (MLM_TPU_NODE), while the `-pod`
runtime on the other hosts serves it. Worker 0's output streams into the task log line by line. The
task fails if the step exits non-zero, naming the worker and its exit code, and says so when the
node was preempted meanwhile. Exit code 2 (the CLI's "bad configuration") fails without retries: a
retry cannot fix it. With `replace_dead_node` (the train task) a node found PREEMPTED or gone is
replaced first, waiting in the triggerer, so a retry after a preemption continues on a fresh VM from
the last checkpoint. The login pins the host keys the node published (plugins/worker_ssh.py): a
worker presenting another key fails the task without retries. Each session has a pty, so closing it
(task killed, timed out, or failed) hangs up the remote step instead of orphaning it; a session lost
without a hang-up (a network partition, a crashed Airflow host) leaves the step running, and the next
try stops it first (the run lock of `remote_command`), so one run never has two trainers. Secrets (the
Hub token) travel in the SSH session's environment (`session_env`), never on the command line.
Google's ComputeEngineSSHHook cannot find TPU VMs, hence the SSH connection's login pointed at each IP.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from gcp_credentials import use_connection
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu.bundle import SESSION_ENV_TOKEN, remote_command, stage_code
from step_context import config_from_xcom
from tpu_operators import NodeEnsurer, run_node_name
from worker_ssh import ssh_connect  # noqa: F401  (the login; re-exported for callers of this module)

TAIL_LINES = 20


@dataclass
class WorkerRun:
    index: int
    host: str
    exit_code: int | None = None      # None: did not finish (connection lost or hung up by us)
    error: str | None = None
    fatal: bool = False               # the error was an AirflowFailException: a retry cannot fix it
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    channel: Any = None
    client: Any = None

    def describe(self) -> str:
        what = f"exit code {self.exit_code}" if self.exit_code is not None else (self.error or "no exit code")
        lines = "\n    ".join(self.tail)
        return f"worker {self.index} ({self.host}): {what}" + (f"; last lines:\n    {lines}" if lines else "")


class RemoteRunner:
    """Runs `command` on every host at once; `connect(host, index)` returns a connected paramiko SSHClient."""

    def __init__(self, hosts: Sequence[str], connect: Callable[[str], Any], log: Any,
                 peer_grace_s: float = 60.0, session_env: dict[str, str] | None = None):
        self.workers = [WorkerRun(i, h) for i, h in enumerate(hosts)]
        self.connect = connect
        self.log = log
        self.peer_grace_s = peer_grace_s
        self.session_env = dict(session_env or {})  # sent as SSH "env" requests: not in argv or logs
        self._lock = threading.Lock()

    def _run_one(self, worker: WorkerRun, command: str) -> None:
        try:
            worker.client = self.connect(worker.host, worker.index)
            channel = worker.client.get_transport().open_session()
            with self._lock:
                worker.channel = channel
            channel.get_pty(width=200)  # a hang-up of the pty is what stops the remote step
            if self.session_env:
                # paramiko sends these without asking for a reply: a name the sshd does not accept is
                # dropped silently, so the remote line checks what it expects (remote_command).
                channel.update_environment(self.session_env)
            channel.exec_command(command)
            for raw in channel.makefile("rb"):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                worker.tail.append(line)
                if worker.index == 0:
                    self.log.info("[worker 0] %s", line)
            code = channel.recv_exit_status()  # -1: hung up, killed by a signal, or connection lost
            if code == -1:
                worker.error = "session ended without an exit status (hung up or killed by a signal)"
            else:
                worker.exit_code = code
        except Exception as err:  # reported per worker in the task's error; the task fails on it
            worker.error = f"{type(err).__name__}: {err}"
            worker.fatal = isinstance(err, AirflowFailException)

    def run(self, command: str) -> list[WorkerRun]:
        threads = [threading.Thread(target=self._run_one, args=(w, command), daemon=True,
                                    name=f"ssh-worker-{w.index}") for w in self.workers]
        for t in threads:
            t.start()
        failed_at = None
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.5)
                if failed_at is None and any(w.exit_code not in (None, 0) or w.error for w in self.workers):
                    failed_at = time.monotonic()
                # In a pod slice the others block in collectives once one worker dies: stop them.
                if failed_at is not None and time.monotonic() - failed_at > self.peer_grace_s:
                    self.log.warning("A worker failed %.0fs ago: hanging up the others.", self.peer_grace_s)
                    self.close()
                    failed_at = float("inf")
        finally:
            self.close()
            for t in threads:
                t.join(timeout=10)
        return self.workers

    def close(self) -> None:
        """Hang up every session: sshd then sends SIGHUP to the remote step."""
        with self._lock:
            for w in self.workers:
                for thing in (w.channel, w.client):
                    if thing is not None:
                        thing.close()


def unreachable_workers(hosts: Sequence[str], port: int, timeout_s: float) -> list[str]:
    """'host: why' for each worker whose port does not answer within timeout_s. A refusal (RST) is
    retried until then (sshd still starting); silence (a firewall dropping packets) ends it at once."""
    import socket

    def probe(host: str) -> str | None:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"{host}:{port}: connection refused for {timeout_s:g}s"
            try:
                with socket.create_connection((host, port), timeout=left):
                    return None
            except ConnectionRefusedError:
                time.sleep(min(1.0, max(left, 0)))
            except TimeoutError:
                return f"{host}:{port}: no answer within {timeout_s:g}s (packets dropped: firewall?)"
            except OSError as err:  # no route, network unreachable
                return f"{host}:{port}: {err.strerror or err}"

    results = [None] * len(hosts)

    def run(i: int) -> None:
        results[i] = probe(hosts[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [f"worker {i} {r}" for i, r in enumerate(results) if r]


def check_reachable(cfg: Any, name: str, hosts: Sequence[str]) -> None:
    """AirflowFailException (no retry can fix a firewall) when any worker's SSH port is unreachable."""
    bad = unreachable_workers(hosts, cfg.tpu.ssh_port, cfg.tpu.ssh_probe_timeout_s)
    if not bad:
        return
    other = "internal" if cfg.tpu.ssh_via == "external" else "external"
    raise AirflowFailException(
        f"Cannot reach SSH on TPU VM {name} via its {cfg.tpu.ssh_via} IPs:\n  " + "\n  ".join(bad) + "\n"
        f"Fix: allow tcp:{cfg.tpu.ssh_port} from Airflow's address to the TPU VMs (`gcloud compute firewall-rules "
        f"create allow-ssh-from-airflow --network={cfg.tpu.network or 'default'} --allow=tcp:{cfg.tpu.ssh_port} "
        "--source-ranges=<Airflow's egress IP>/32`); if Airflow runs outside the VPC use tpu.ssh_via=external "
        f"with tpu.external_ips=true, inside it tpu.ssh_via={other} may be the one that works. If the port "
        "answers but login fails, check the node's enable-oslogin metadata (tpu.enable_oslogin=false makes "
        "the tpu_ssh connection's key in ssh-keys count). The VM is deleted by the teardown task.")


class TpuSSHStepOperator(NodeEnsurer, BaseOperator):
    """Run `python -m mlm_tasks <step>` (or `command`) on the run's TPU VM (worker 0 of a pod slice)."""

    template_fields = ("config", "step", "step_args", "command", "node_name")
    ui_color = "#e8f7d7"
    CONFIG_ERROR_EXIT = 2  # mlm_tasks.cli: bad configuration

    def __init__(self, *, config: Any, step: str = "train", step_args: Sequence[str] = (),
                 command: str | None = None, node_name: str | None = None, peer_grace_s: float = 60.0,
                 replace_dead_node: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.step = step
        self.step_args = list(step_args)
        self.command = command
        self.node_name = node_name
        self.peer_grace_s = peer_grace_s
        self.replace_dead_node = replace_dead_node
        self._runner: RemoteRunner | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config_from_xcom(self.config)
        if cfg.compute != "tpu_vm":
            raise AirflowSkipException(f"compute is {cfg.compute!r}: the step runs locally, not here.")
        with use_connection(cfg.gcp_conn_id):
            return self._execute_tpu(context, cfg)

    def _execute_tpu(self, context: Any, cfg: Any) -> dict[str, Any]:
        name = run_node_name(context, self.node_name)
        node = tpu.get_state(cfg.tpu, name)
        if node.ready:
            return self.run_step(context, cfg, node)
        if not self.replace_dead_node:
            raise AirflowException(f"TPU VM {name} is {node.state}, not READY: clear the create_tpu_vm "
                                   "task (it replaces a dead node) and this one.")
        # A setup task is not rerun on a retry of this one: replace a preempted (or deleted) node here.
        self.log.warning("TPU VM %s is %s, not READY (preempted?): getting a READY one before the step.",
                         name, node.state)
        return self.ensure_then(context, cfg, name, time.time() + cfg.tpu.create_timeout_s)

    def node_ready(self, context: Any, cfg: Any, node: dict[str, Any]) -> dict[str, Any]:
        with use_connection(cfg.gcp_conn_id):
            return self.run_step(context, cfg, tpu.get_state(cfg.tpu, node["name"]))

    def remote_args(self, context: Any) -> list[str]:
        """Extra CLI arguments of the step; subclasses add what they pull from XCom."""
        return list(self.step_args)

    def session_env(self, cfg: Any) -> dict[str, str]:
        """Secrets for the remote step, sent in the SSH session's environment; subclasses add them."""
        return {}

    def step_env(self, cfg: Any) -> dict[str, str]:
        """Non-secret variables for the remote step (they are part of the logged command line)."""
        return {}

    def run_step(self, context: Any, cfg: Any, node: tpu.NodeState) -> dict[str, Any]:
        from mlm_tasks.tpu import runtimes

        name = node.name
        if not node.ready:
            raise AirflowException(f"TPU VM {name} is {node.state} again before the step could start: retry.")
        hosts = tpu.worker_endpoints(node, external=cfg.tpu.ssh_via == "external")
        # The step may run for up to ttl_hours from now: keep the janitor off the node until then.
        tpu.refresh_expiry(cfg.tpu, node, tpu.labels(context["run_id"], cfg.tpu.ttl_hours)["expires"])
        # The API's own answer (one network endpoint per host) decides, not a table of accelerator types.
        multi_host = len(hosts) > 1
        runtime = runtimes.get(cfg.tpu.runtime_version)
        if multi_host != runtime.pod:
            raise AirflowFailException(
                f"TPU VM {name} has {len(hosts)} host(s) but runs {runtime.version}, a "
                f"{'multi' if runtime.pod else 'single'}-host runtime: use "
                f"{'a -pod runtime' if multi_host else 'a runtime without -pod'} for {cfg.tpu.accelerator_type}.")
        check_reachable(cfg, name, hosts[:1])  # only worker 0 is dialled, on one host or a pod
        session_env = self.session_env(cfg)
        command = self.command or remote_command(
            cfg, self.step, context["run_id"], node=name, extra_args=self.remote_args(context), env=self.step_env(cfg),
            expect_token=SESSION_ENV_TOKEN in session_env,
            code=stage_code(cfg.output_root, cfg.tpu.runtime_version) if cfg.tpu.bootstrap else None)
        if multi_host:
            self.log.info("%s is a %d-host slice: running %r on worker 0 (%s) only; the -pod runtime on the "
                          "other hosts serves it.", name, len(hosts), self.step, hosts[0])
        else:
            self.log.info("Running %r on %s (%s).", self.step, name, hosts[0])
        # Made here: the SSH threads do not see this thread's handed-in credentials.
        api = tpu.client(cfg.tpu)
        connect = ssh_connect(cfg.tpu.ssh_conn_id, cfg.tpu.ssh_port, node=name,
                              published=lambda worker: tpu.host_keys(cfg.tpu, name, worker, api=api))
        self._runner = RemoteRunner(hosts[:1], connect, self.log, self.peer_grace_s, session_env=session_env)
        workers = self._runner.run(command)
        failed = [w for w in workers if w.exit_code != 0]
        if failed:
            message = self._failure_message(cfg, name, failed)
            if any(w.fatal for w in failed):  # e.g. a host-key mismatch: the same machine would answer
                raise AirflowFailException(message)
            if all(w.exit_code == self.CONFIG_ERROR_EXIT for w in failed):
                raise AirflowFailException(message + "\nExit code 2 is a configuration error: fix the "
                                           "input and trigger a new run (a retry would fail the same way).")
            raise AirflowException(message)
        return {"node": name, "workers": len(hosts)}

    def _failure_message(self, cfg: Any, name: str, failed: list[WorkerRun]) -> str:
        lines = [f"Step {self.step!r} failed on TPU VM {name}:"] + [w.describe() for w in failed]
        try:
            state = tpu.get_state(cfg.tpu, name).state
        except Exception as err:  # the failure itself matters more than this extra hint
            state = f"unknown ({err})"
        if state != "READY":
            then = ("A retry of this task replaces it" if self.replace_dead_node else
                    "Clear create_tpu_vm and this task to continue on a new VM")
            lines.append(f"The TPU VM is now {state}: it was probably preempted. {then} (training resumes "
                         "from its last checkpoint).")
        return "\n".join(lines)

    def on_kill(self) -> None:
        if self._runner is not None:
            self.log.info("Task killed: hanging up the SSH sessions, which stops the remote step.")
            self._runner.close()
