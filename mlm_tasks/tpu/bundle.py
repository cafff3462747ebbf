"""What runs on a TPU VM: an idempotent install of this project beside the image's TensorFlow, then one step.

    bundle = stage_code(cfg.output_root, cfg.tpu.runtime_version)          # once, from the Airflow worker
    line = remote_command(cfg, "train", run_id, node=name, code=bundle)     # the line worker 0 runs
    ssh_command(22, "~/.ssh/id_ed25519", "mlm@10.0.0.2", line)              # that line for a person's shell

The bundle is checked by sha256 before it is unpacked; the Hub token reaches the step on stdin. docs/google-cloud.md.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import join
from mlm_tasks.tpu import runtimes

if TYPE_CHECKING:  # types only: config imports this package's tables, so tpu/ imports no config at run time
    from mlm_tasks.config import PipelineConfig

PACKAGE_DIR = runtimes.PACKAGE_DIR

TOKEN_PROMPT = "MLM_SEND_HUB_TOKEN"  # the line prints it; the session answers with the token on stdin
TOKEN_VAR = "mlm_hf_token"  # the line's own, unexported copy of the token
TOKEN_ARG = "--hub-token-stdin"  # the step reads the token from its stdin (mlm_tasks/cli.py)
# FORCE_TF_AVAILABLE: a custom image's TPU build may carry another wheel name (tensorflow-tpu) than `tensorflow`.
VM_ENV = {"FORCE_TF_AVAILABLE": "1", "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
STOP_GRACE_S = 60  # an earlier try's step: SIGTERM, then SIGKILL after this (TF may take seconds to free the chips)
KILL_WAIT_S = 10  # after SIGKILL the kernel drops the lock once the process group is gone


@dataclass(frozen=True)
class CodeBundle:
    sha: str  # content hash of the package (code and VM locks)
    uri: str  # folder holding mlm_tasks.tar.gz
    lock: str  # the runtime's VM lock, relative to the unpacked code
    lock_sha: str  # content hash of that lock: its install is shared by every code version
    tensorflow: str  # the image TensorFlow the runtime promises
    pod: bool = False  # a -pod runtime: the image check also imports the TPU client
    tar_sha256: str = ""  # full sha256 of the tarball's bytes: the VM unpacks nothing else


def _package_files(package_dir: Path) -> list[tuple[str, bytes]]:
    return [
        (f"{package_dir.name}/{path.relative_to(package_dir).as_posix()}", path.read_bytes())
        for path in sorted(package_dir.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    ]


def _tarball(files: list[tuple[str, bytes]]) -> bytes:
    """Same files -> same bytes (zero mtimes and owners), so the sha names the content."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def stage_code(output_root: str, runtime_version: str, package_dir: Path = PACKAGE_DIR) -> CodeBundle:
    """Upload the package (as installed, or `package_dir`) to output_root/_code/<sha>/ unless already there."""
    bundle, tarball = code_bundle(output_root, runtime_version, package_dir)
    marker, uri = join(bundle.uri, "_SUCCESS"), join(bundle.uri, "mlm_tasks.tar.gz")
    # The marker says an upload finished, not that the bytes are still ours: read them back every time.
    if not (
        storage.exists(marker)
        and storage.exists(uri)
        and hashlib.sha256(storage.read_bytes(uri)).hexdigest() == bundle.tar_sha256
    ):
        storage.write_bytes(uri, tarball)
        storage.write_text(marker, bundle.sha)  # last: a bundle with a marker is complete
    return bundle


def code_bundle(output_root: str, runtime_version: str, package_dir: Path = PACKAGE_DIR) -> tuple[CodeBundle, bytes]:
    """What stage_code would upload, and where, without any I/O (the smoke tool's dry run prints it)."""
    runtime = runtimes.get(runtime_version)
    files = _package_files(package_dir)
    lock_name = f"{package_dir.name}/{runtime.lock_path.relative_to(runtimes.PACKAGE_DIR).as_posix()}"
    lock = dict(files).get(lock_name)
    if lock is None:
        raise ConfigError(
            f"{package_dir} has no {lock_name}: this install of mlm_tasks lacks its package data "
            "(the VM locks). Reinstall the project (pip install .), or stage from a checkout."
        )
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    sha = digest.hexdigest()[:16]
    tarball = _tarball(files)
    bundle = CodeBundle(
        sha=sha,
        uri=join(output_root, "_code", sha),
        lock=lock_name,
        lock_sha=hashlib.sha256(lock).hexdigest()[:16],
        tensorflow=runtime.tensorflow,
        pod=runtime.pod,
        tar_sha256=hashlib.sha256(tarball).hexdigest(),
    )
    return bundle, tarball


def ssh_command(port: int, key: str, login: str, remote: str) -> str:
    """An `ssh` line a person can paste that runs the shell line `remote` on a worker: every part quoted, and
    `remote` one argument (ssh joins its arguments with spaces; the worker's shell splits the line again)."""
    return shlex.join(["ssh", "-p", str(port), "-i", key, login, remote])


def shell_path(path: str) -> str:
    """Quote a path but keep a leading ~ meaning the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# `python -c FETCH gs://bucket/object dest`: the standard library alone (importing TensorFlow would take the
# chips), STORAGE_EMULATOR_HOST when set, else the GCS JSON API as the VM's service account.
FETCH = (
    "import json, os, shutil, sys, urllib.parse as p, urllib.request as r; "
    "e = os.environ.get('STORAGE_EMULATOR_HOST', '').rstrip('/'); b, _, n = sys.argv[1][5:].partition('/'); "
    "m = 'http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token'; "
    "a = {} if e else {'Authorization': 'Bearer ' + json.load(r.build_opener(r.ProxyHandler({})).open("
    "r.Request(m, headers={'Metadata-Flavor': 'Google'}), timeout=60))['access_token']}; "
    "u = (e or 'https://storage.googleapis.com') + f'/download/storage/v1/b/{b}/o/{p.quote(n, safe=\"\")}?alt=media'; "
    "shutil.copyfileobj(r.urlopen(r.Request(u, headers=a), timeout=60), open(sys.argv[2], 'wb'))"
)


def _fetch(py: str, uri: str) -> str:
    """Shell that copies the bundle's tarball from `uri` into the current directory (gs://: FETCH)."""
    tarball = join(uri, "mlm_tasks.tar.gz")
    if storage.scheme(uri) == "gs":
        return f"{py} -c {shlex.quote(FETCH)} {shlex.quote(tarball)} mlm_tasks.tar.gz"
    return f"cp {shlex.quote(storage.local_path(tarball))} ."


def _bootstrap(cfg: PipelineConfig, code: CodeBundle) -> list[str]:
    # Every value is quoted, even the hex ones: a bundle may come from anywhere (tests build their own).
    q = shlex.quote
    py, installed = q(cfg.tpu.python), q(f".installed-{code.sha}")
    deps, deps_tmp = q(f"deps-{code.lock_sha}"), q(f"deps-{code.lock_sha}.tmp")
    want = q(code.tar_sha256)
    tar_hash = "$(sha256sum mlm_tasks.tar.gz 2>/dev/null | cut -c1-64)"
    mismatch = (
        f'echo "The staged code "{q(join(code.uri, "mlm_tasks.tar.gz"))}" has sha256 {tar_hash}, not "{want}'
        f'" (hash mismatch: it changed after staging). Retry the task: stage_code re-uploads a bundle whose '
        'bytes differ; if it fails again, check who writes under output_root/_code/." >&2; exit 3'
    )
    unpack = " && ".join(
        [
            _fetch(py, code.uri),
            # Before tar: nothing of an unverified tarball is unpacked, let alone imported.
            f'{{ [ "{tar_hash}" = {want} ] || {{ {mismatch}; }}; }}',
            "rm -rf code.tmp && mkdir code.tmp && tar -xzf mlm_tasks.tar.gz -C code.tmp"
            " && rm -rf code && mv code.tmp code",
            f"touch {installed}",
        ]
    )
    # --no-deps: never PyPI's TensorFlow (tf-keras asks for it); --require-hashes: only the wheels locked.
    install = " && ".join(
        [
            f"rm -rf {deps_tmp}",
            f"{py} -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: "
            f"--target {deps_tmp} -r code/{q(code.lock)}",
            # Once per lock: the image must hold the runtime's TensorFlow and whatever the lock needs.
            f'PYTHONPATH="$PWD/code:$PWD/"{deps_tmp} {py} -m mlm_tasks.tpu.vm.check_image '
            f"{q(code.tensorflow)} {deps_tmp}" + (" --pod" if code.pod else ""),
            f"mv {deps_tmp} {deps}",
        ]
    )
    fetch_failed = q(
        f"Fetching the staged code from {code.uri} failed (see above): check that the VM can read "
        "the bucket (its service account needs storage access)."
    )
    install_failed = q(
        "Installing the VM lock failed (see above): the VM needs the package index (external IP "
        "or Cloud NAT), and tpu.runtime_version must name the image it runs."
    )
    # `set -e` ignores a failure inside an && chain: each chain says so and exits itself.
    return [
        # The marker alone is not trusted: the tarball kept beside code/ must still have the bundle's hash.
        f'if [ ! -f {installed} ] || [ "{tar_hash}" != {want} ]; then rm -f {installed}; '
        f'echo {q(f"Installing project {code.sha} in ")}"$PWD"; '
        f"{unpack} || {{ echo {fetch_failed} >&2; exit 3; }}; fi",
        f"if [ ! -d {deps} ]; then echo {q(f'Installing {Path(code.lock).name} beside the image TensorFlow')}; "
        f"{install} || {{ echo {install_failed} >&2; exit 3; }}; fi",
        f'export PYTHONPATH="$PWD/code:$PWD/"{deps}"${{PYTHONPATH:+:$PYTHONPATH}}"',
    ]


def run_lock_name(run_id: str, step: str) -> str:
    """The lock file (in tpu.workdir) of one run's step: a hash, since a run id may hold any character."""
    return ".run-lock-" + hashlib.sha256(f"{run_id}\0{step}".encode()).hexdigest()[:16]


def _run_lock(step: str, run_id: str, grace_s: int = STOP_GRACE_S) -> list[str]:
    """Shell that takes the run's lock for `step` on fd 9 (stopping an earlier try's step that holds it)
    and writes the holder's pid beside it; the step inherits fd 9, so the lock lives exactly as long as it."""
    lock = run_lock_name(run_id, step)
    q, pid_file = shlex.quote(lock), shlex.quote(lock + ".pid")
    who = shlex.quote("trainer" if step == "train" else f"{step} step")
    # The pid file alone may be stale (a recycled pid): signal it only if that process holds the lock file.
    holder = f'[ -n "$pid" ] && [ "$(stat -L -c %d:%i "/proc/$pid/fd/9" 2>/dev/null)" = "$(stat -c %d:%i {q})" ]'
    # The holder leads its process group (its children go too); SIGCONT lets a frozen trainer handle SIGTERM.
    stop = (
        f'echo "Stopping the "{who}" left by an earlier try (pid $pid) of this run: SIGTERM, then SIGKILL '
        f'after {grace_s}s."; {{ kill -s TERM -- "-$pid" || kill -s TERM "$pid"; }} 2>/dev/null || true; '
        'kill -s CONT -- "-$pid" 2>/dev/null || true; '
        f'if ! flock -w {grace_s} 9; then echo "pid $pid still runs after {grace_s}s: SIGKILL."; '
        f'kill -s KILL -- "-$pid" 2>/dev/null || kill -s KILL "$pid" 2>/dev/null || true; fi'
    )
    stuck = (
        f'echo "The run lock $PWD/"{q}" is still held (its pid file names ${{pid:-nobody}}): another copy of '
        f'this run\'s "{who}" runs. Find it with: fuser -v $PWD/"{q}"; stop it, then clear this task." '
        ">&2; exit 3"
    )
    # `exec 9>>` inside `{ }` runs in this shell (no subshell), so the step's `exec` inherits fd 9.
    return [
        f"if ! {{ exec 9>>{q} && flock -n 9; }}; then pid=$(cat {pid_file} 2>/dev/null || true); "
        f"if {holder}; then {stop}; fi; flock -w {KILL_WAIT_S} 9 || {{ {stuck}; }}; "
        f'echo "The earlier try stopped: starting this one."; fi',
        f"echo $$ > {pid_file}",
    ]


def _bundle_to_install(cfg: PipelineConfig, code: CodeBundle | None) -> CodeBundle | None:
    """The bundle the VM installs first: `code` with tpu.bootstrap, None without (the project is in tpu.workdir)."""
    if not cfg.tpu.bootstrap:
        return None
    if code is None:
        raise ConfigError(
            "tpu.bootstrap is on but no code bundle was given: call stage_code() first, "
            "or set tpu.bootstrap=false when the VM already has the project in tpu.workdir."
        )
    if not re.fullmatch(r"[0-9a-f]{64}", code.tar_sha256):
        raise ConfigError(
            f"The code bundle {code.uri} has no sha256 of its tarball: make it with stage_code(), "
            "which the VM's check needs."
        )
    return code


def remote_command(
    cfg: PipelineConfig,
    step: str,
    run_id: str,
    *,
    node: str,
    extra_args: Sequence[str] = (),
    code: CodeBundle | None = None,
    env: dict[str, str] | None = None,
    expect_token: bool = False,
    detach_log: str | None = None,
) -> str:
    """The shell line worker 0 of TPU VM `node` runs: [install once] then `python -m mlm_tasks <step> ...`.
    `env`: more (non-secret) variables for the step; `expect_token`: the session sends the Hub token on stdin;
    `detach_log`: start the step detached, its output in that file; the line prints `JOB_MARK pid=<pid>`."""
    install = _bundle_to_install(cfg, code)
    config_json = json.dumps(cfg.model_dump(mode="json"), separators=(",", ":"))
    argv = [cfg.tpu.python, "-m", "mlm_tasks", step, "--config-json", config_json, "--run-id", run_id, *extra_args]
    step_line = shlex.join(argv)
    # Before anything imports TensorFlow: the runtime's, MLM_TPU_NODE on a pod (TPUClusterResolver), ours, tpu.env.
    runtime = runtimes.get(cfg.tpu.runtime_version)
    on_pod = {"MLM_TPU_NODE": node} if runtime.pod else {}
    variables = {**runtimes.ENVIRONMENT[runtime.pod], **VM_ENV, **on_pod, **cfg.tpu.env, **(env or {})}
    bad = [k for k in variables if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ConfigError(f"tpu.env has invalid variable names {bad}: use letters, digits and _.")
    parts = ["set -e", f"mkdir -p {shell_path(cfg.tpu.workdir)}", f"cd {shell_path(cfg.tpu.workdir)}"]
    parts += [f"export {k}={shlex.quote(v)}" for k, v in sorted(variables.items())]
    parts += runtimes.libtpu_probe(runtime, shlex.quote(cfg.tpu.python))
    # The token arrives on stdin, never in this line or an environment; echo off, so the pty does not log it.
    if expect_token:
        parts += [
            "stty -echo 2>/dev/null || true",
            f"echo {TOKEN_PROMPT}",
            f"IFS= read -r {TOKEN_VAR} || true",
            f'if [ -z "${TOKEN_VAR}" ]; then echo "The Hub token did not reach the VM (the session sends it on '
            f"stdin when the line prints {TOKEN_PROMPT}): retry; if it repeats, check the Hub "
            'connection (publish.hf_conn_id) has a password." >&2; exit 3; fi',
        ]
        step_line = f"{step_line} {TOKEN_ARG}"
    # The lock before the install: a retry never swaps `code/` under a step an earlier try left running.
    parts += _run_lock(step, run_id)
    if install is not None:
        parts += _bootstrap(cfg, install)
    # printf is a builtin: the token is in no argv.
    feed = f"printf '%s\\n' \"${TOKEN_VAR}\" | " if expect_token else ""
    if detach_log is not None:
        return "; ".join(parts + _detached(step_line, detach_log, run_lock_name(run_id, step), feed))
    # exec: the session's hang-up (task killed) reaches the step, and it keeps the run lock's fd 9.
    parts.append(f"{feed}exec {step_line}")
    return "; ".join(parts)


JOB_MARK = "MLM_JOB"  # a detached start prints it with the job's pid: the caller's handle


def exit_file(log: str) -> str:
    """Where a detached step's wrapper records its exit code (missing: it was killed, or still runs)."""
    return log + ".exit"


def _detached(step_line: str, log: str, lock: str, feed: str = "") -> list[str]:
    """Shell that starts the step as a job of the VM, not of the SSH session (setsid, nohup: no hang-up reaches
    it), holding the run lock's fd 9; a wrapper records its exit code beside the log (137: SIGKILL)."""
    q = shlex.quote
    folder = log.rsplit("/", 1)[0] if "/" in log else "."
    wrapped = f"{step_line}; echo $? > {q(exit_file(log))}"
    # trap: a hang-up before setsid runs in the child would kill it; an ignored SIGHUP is inherited.
    return [
        f"mkdir -p {q(folder)}",
        f"rm -f {q(exit_file(log))}",
        "trap '' HUP",
        # `feed` (the token's pipe) replaces /dev/null as stdin; `$!` is the job's pid either way.
        f"{feed}setsid nohup sh -c {q(wrapped)} > {q(log)} 2>&1{'' if feed else ' < /dev/null'} & "
        f'pid=$!; echo "$pid" > {q(lock + ".pid")}; echo "{JOB_MARK} pid=$pid"',
    ]
