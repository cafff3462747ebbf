"""Run one pipeline step on the run's TPU VM over SSH (the `compute: tpu_vm` path), attached or detached.

    remote = RemoteStep("train", log, args=[...], hub_token=token)     # what TrainOperator composes
    remote.run(context, cfg, node)                                      # attached: {"node", "workers"}
    remote.start(context, cfg, node)                                    # detached (train): the trainer's handle
    step_on_vm(context, cfg, "evaluate", ["--data-fingerprint", fp])    # evaluate, downstream, fill_mask: the result

Only worker 0 is dialled (TensorFlow on TPU is single-client), as the Airflow SSH connection `tpu.ssh_conn_id`
(Google's ComputeEngineSSHHook cannot find TPU VMs); the pty makes a hang-up (task killed) stop the step.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlm_airflow.connections import ssh_connect, use_connection
from mlm_airflow.operators.tpu_vm import run_node_name
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import NO_RETRY_EXIT, NoRetryError, TransientError
from mlm_tasks.job import launch as vm_job
from mlm_tasks.job.follow import JobWatch
from mlm_tasks.job.launch import Log
from mlm_tasks.results import TrainJob
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import ssh
from mlm_tasks.tpu.bundle import TOKEN_PROMPT, remote_command, stage_code

if TYPE_CHECKING:
    from pydantic import JsonValue  # what Airflow's task state store takes

log = logging.getLogger(__name__)
JOB_KEY = "train_job"
ON_KILL_STOP_S = 4.0  # Airflow's supervisor SIGKILLs a task 5 s after asking it to stop


def try_number(context: Context) -> int:
    """The Airflow try running this code (1 outside Airflow)."""
    ti = context.get("ti")
    number = getattr(ti, "try_number", None) or os.environ.get("AIRFLOW_CTX_TRY_NUMBER", "")
    return int(number) if str(number).isdigit() else 1


def check_reachable(cfg: PipelineConfig, name: str, host: str) -> None:
    """AirflowFailException (no retry can fix a firewall) when worker 0's SSH port is unreachable."""
    problem = ssh.unreachable(host, cfg.tpu.ssh_port, ssh.PROBE_TIMEOUT_S)
    if problem is None:
        return
    other = "internal" if cfg.tpu.ssh_via == "external" else "external"
    raise AirflowFailException(
        f"Cannot reach SSH on TPU VM {name} via its {cfg.tpu.ssh_via} IPs:\n  worker 0 {problem}\n"
        f"Fix: allow tcp:{cfg.tpu.ssh_port} from Airflow's address to the TPU VMs (`gcloud compute firewall-rules "
        f"create allow-ssh-from-airflow --network={cfg.tpu.network or 'default'} --allow=tcp:{cfg.tpu.ssh_port} "
        "--source-ranges=<Airflow's egress IP>/32`); if Airflow runs outside the VPC use tpu.ssh_via=external "
        f"with tpu.external_ips=true, inside it tpu.ssh_via={other} may be the one that works. If the port "
        "answers but login fails, check the node's enable-oslogin metadata (tpu.enable_oslogin=false makes "
        "the tpu_ssh connection's key in ssh-keys count). The VM is deleted by the teardown task."
    )


@dataclass(eq=False)
class RemoteStep:
    """`python -m mlm_tasks <step> <args>` (or `command`) on worker 0 of the run's TPU VM.

    `hub_token` goes on the session's stdin when the line asks (bundle.TOKEN_PROMPT); `step_env` holds
    non-secret variables (part of the logged command line). `close()` (on_kill) hangs the session up."""

    step: str
    log: Log
    _: KW_ONLY
    args: Sequence[str] = ()
    command: str | None = None
    hub_token: str | None = field(default=None, repr=False)  # a secret
    step_env: dict[str, str] = field(default_factory=dict)
    replaces_dead_node: bool = False
    session: ssh.Session | None = field(default=None, init=False)
    watch: JobWatch | None = field(default=None, init=False)  # a detached trainer's, once started
    output: list[str] = field(default_factory=list, init=False)  # worker 0's lines, as logged

    def _line(self, line: str) -> None:
        self.output.append(line)
        self.log.info("[worker 0] %s", line)

    def run(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> dict[str, Any]:
        name, hosts, connect = self.connect_to(context, cfg, node)
        command = self.command or self.remote_line(context, cfg, name)
        self.session = ssh.Session(connect, hosts[0], on_line=self._line)
        outcome = self.session.run(command, secret=self.secret())
        if outcome.exit_code != 0:
            raise self.failure(cfg, name, outcome)
        return {"node": name, "workers": len(hosts)}

    def start(self, context: Context, cfg: PipelineConfig, node: tpu.NodeState) -> TrainJob:
        """The step as a detached job on worker 0 (train): the new trainer's handle, also kept as JOB_KEY."""
        name, hosts, connect = self.connect_to(context, cfg, node)
        host, number = hosts[0], try_number(context)
        log_name = vm_job.log_name(context["run_id"], number)
        command = self.command or self.remote_line(
            context, cfg, name, detach_log=log_name, env={"MLM_TRY_NUMBER": str(number)}
        )
        self.log.info(
            "Starting the trainer detached on worker 0 of %s (try %d); its output goes to %s/%s.",
            *(name, number, cfg.tpu.workdir, log_name),
        )
        self.session = ssh.Session(connect, host, on_line=self._line)  # close() (on_kill) hangs up a start
        outcome, job = vm_job.start(
            self.session,
            command,
            secret=self.secret(),
            node=name,
            node_created=node.created,
            host=host,
            try_number=number,
            workdir=cfg.tpu.workdir,
            output_root=cfg.output_root,
            run_id=context["run_id"],
        )
        if outcome.exit_code != 0:
            raise self.failure(cfg, name, outcome)
        if job is None:
            raise AirflowException(
                f"The detached start on {name} printed no job id ({outcome.describe()}): "
                "retry; if it repeats, run the line by hand on worker 0."
            )
        self.log.info("Trainer started: pid %d (its process group) on %s.", job["pid"], name)
        store = context.get("task_state_store")
        if store is not None:
            # A handle is JSON (str, int and float fields); mypy sees no TypedDict as a dict[str, JsonValue].
            store.set(JOB_KEY, cast("JsonValue", dict(job)))
        stall_s = cfg.train.stall_minutes * 60
        self.watch = JobWatch(
            vm_job.DetachedJob(job, connect), cfg.tpu, output_root=cfg.output_root, stall_s=stall_s, log=self.log
        )
        return job

    def remote_line(self, context: Context, cfg: PipelineConfig, name: str, **options: Any) -> str:
        """remote_command for this step; `options` go to it (detach_log, more env)."""
        return remote_command(
            cfg,
            self.step,
            context["run_id"],
            node=name,
            extra_args=self.args,
            env={**self.step_env, **options.pop("env", {})},
            expect_token=self.hub_token is not None,
            code=stage_code(cfg.output_root, cfg.tpu.runtime_version) if cfg.tpu.bootstrap else None,
            **options,
        )

    def secret(self) -> tuple[str, str] | None:
        """What the session answers the line's token prompt with (ssh.Session.run)."""
        return (TOKEN_PROMPT, self.hub_token) if self.hub_token is not None else None

    def failure(self, cfg: PipelineConfig, name: str, outcome: ssh.Outcome) -> AirflowException:
        """What to raise for a command that failed on worker 0 (with the node's state now): exit 2 and fatal
        errors are not retried."""
        import requests
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError

        message = f"Step {self.step!r} failed on TPU VM {name}:\n{outcome.describe()}"
        try:
            state = tpu.get_state(cfg.tpu, name).state
        except (GoogleAPIError, GoogleAuthError, requests.RequestException, NoRetryError, TransientError) as err:
            # what the TPU API client raises: the failure itself matters more than this extra hint
            state = f"unknown ({err})"
        if state != "READY":
            then = (
                "A retry of this task replaces it"
                if self.replaces_dead_node
                else "Clear create_tpu_vm and this task to continue on a new VM"
            )
            message += (
                f"\nThe TPU VM is now {state}: it was probably preempted. {then} (training resumes "
                "from its last checkpoint)."
            )
        if outcome.fatal:  # e.g. a host-key mismatch: a retry meets the same machine
            return AirflowFailException(message)
        if outcome.exit_code == NO_RETRY_EXIT:
            return AirflowFailException(
                message + "\nExit code 2 is an error no retry can fix (a bad input, a "
                "missing artifact, a refused credential): act on the message above and "
                "trigger a new run."
            )
        return AirflowException(message)

    def connect_to(
        self, context: Context, cfg: PipelineConfig, node: tpu.NodeState
    ) -> tuple[str, list[str], ssh.Connect]:
        """(node name, worker hosts, connect) once the node is READY, fits its runtime and worker 0's port answers."""
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
                f"{'a -pod runtime' if multi_host else 'a runtime without -pod'} for {cfg.tpu.accelerator_type}."
            )
        check_reachable(cfg, name, hosts[0])  # only worker 0 is dialled, on one host or a pod
        if multi_host:
            self.log.info(
                "%s is a %d-host slice: running %r on worker 0 (%s) only; the -pod runtime on the "
                "other hosts serves it.",
                *(name, len(hosts), self.step, hosts[0]),
            )
        else:
            self.log.info("Running %r on %s (%s).", self.step, name, hosts[0])
        api = tpu.client(cfg.tpu)
        connect = ssh_connect(
            cfg.tpu.ssh_conn_id, cfg.tpu.ssh_port, node=name, published=tpu.published_keys(cfg.tpu, name, api=api)
        )
        return name, hosts, connect

    def close(self) -> None:
        """on_kill: stop a started trainer (in a thread, bounded: on_kill runs in a signal handler that may have
        interrupted an SSH call and its locks; a stop not done in time is left to the teardown), then hang up."""
        watch = self.watch
        if watch is not None:
            outcome: list[vm_job.Probe] = []
            stopper = threading.Thread(target=lambda: outcome.append(watch.stop()), daemon=True)
            stopper.start()
            stopper.join(ON_KILL_STOP_S)
            gone = bool(outcome) and outcome[0].alive is False
            unconfirmed = (
                f"maybe still running (no confirmation within {ON_KILL_STOP_S:g}s; the teardown deletes the VM)"
            )
            self.log.info("Task killed: the trainer is %s.", "gone" if gone else unconfirmed)
        if self.session is not None:
            self.log.info("Task killed: hanging up the SSH session, which stops the remote step.")
            self.session.close()


def step_on_vm(context: Context, cfg: PipelineConfig, step: str, args: Sequence[str] = ()) -> Any:
    """`python -m mlm_tasks <step> <args>` on the run's TPU VM, attached; the step's result (the JSON the CLI
    prints last). How evaluate, downstream and fill_mask judge the model where it trained."""
    name = run_node_name(context)
    remote = RemoteStep(step, log, args=args)
    with use_connection(cfg.gcp_conn_id):
        node = tpu.get_state(cfg.tpu, name)
        if not node.ready:
            raise AirflowException(
                f"TPU VM {name} is {node.state}: {step!r} runs on the VM the model trained on, which is gone "
                "(preempted?). The model is safe in output_root: clear create_tpu_vm and this task to run it on a "
                "new VM."
            )
        remote.run(context, cfg, node)
    return step_result(step, remote.output)


def step_result(step: str, lines: Sequence[str]) -> Any:
    """The JSON value the CLI printed last among `lines` (indented over a pty, one line into a file)."""
    decoder = json.JSONDecoder()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(("{", "[")):
            try:
                return decoder.raw_decode("\n".join(lines[i:]))[0]
            except json.JSONDecodeError:
                continue
    raise AirflowException(f"Step {step!r} ended without printing its result (the JSON `python -m mlm_tasks` prints).")
