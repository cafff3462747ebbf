"""What runs on a TPU VM: an idempotent install of this project beside the image's TensorFlow,
then one CLI step.

    bundle = stage_code(cfg.output_root, cfg.tpu.runtime_version)          # once, from the Airflow worker
    line = remote_command(cfg, "train", run_id, node=name, code=bundle)     # the line worker 0 runs

`stage_code` puts a deterministic tarball of the installed `mlm_tasks` package (package data
included: the VM locks under mlm_tasks/vm/) under output_root/_code/<sha>/ — content-addressed, so
an unchanged project is uploaded once, and a wheel or Docker install stages exactly what a checkout
does. The remote line fetches and unpacks it when `<workdir>/.installed-<sha>` is missing, and
installs the runtime's VM lock (mlm_tasks.vm.runtimes) with `pip --no-deps --target` into
`<workdir>/deps-<lock sha>/` when that is missing: nothing of the image (its Python, its TPU build of
TensorFlow, numpy, protobuf) is replaced, and the image is checked to hold the runtime's TensorFlow.
Then it runs `python -m mlm_tasks <step> --config-json <cfg> --run-id <run>`. With
`tpu.bootstrap: false` it runs the step from `tpu.workdir` as it is (a custom image, or tests).

Secrets never ride on the command line (it shows in `ps` and in logs): the Hub token reaches the
step through the SSH session's environment as LC_MLM_HF_TOKEN (stock Ubuntu sshd accepts LC_*
variables; see `SESSION_ENV_TOKEN`), and the line hands it on as HF_TOKEN.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.paths import join

PACKAGE_DIR = Path(__file__).resolve().parent
# Ubuntu's sshd_config has `AcceptEnv LANG LC_*`: an LC_ name passes through a stock TPU VM's sshd.
SESSION_ENV_TOKEN = "LC_MLM_HF_TOKEN"
# transformers 4.57 finds TensorFlow only under distribution names it knows (tensorflow,
# tensorflow-cpu, ...), not the image's TPU build: this tells it TensorFlow is there.
VM_ENV = {"FORCE_TF_AVAILABLE": "1", "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class CodeBundle:
    sha: str        # content hash of the package (code and VM locks)
    uri: str        # folder holding mlm_tasks.tar.gz
    lock: str       # the runtime's VM lock, relative to the unpacked code
    lock_sha: str   # content hash of that lock: its install is shared by every code version
    tensorflow: str  # the image TensorFlow the runtime promises
    pod: bool = False  # a -pod runtime: the image check also imports the TPU client


def _package_files(package_dir: Path) -> list[tuple[str, bytes]]:
    files = []
    for path in sorted(package_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files.append((f"{package_dir.name}/{path.relative_to(package_dir).as_posix()}", path.read_bytes()))
    return files


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
    """Upload the package (from wherever it is installed, or `package_dir`) to output_root/_code/<sha>/
    unless already there."""
    from mlm_tasks.vm import runtimes

    runtime = runtimes.get(runtime_version)
    files = _package_files(package_dir)
    lock_name = f"{package_dir.name}/{runtime.lock_path.relative_to(runtimes.HERE.parent).as_posix()}"
    lock = dict(files).get(lock_name)
    if lock is None:
        raise ConfigError(f"{package_dir} has no {lock_name}: this install of mlm_tasks lacks its package data "
                          "(the VM locks). Reinstall the project (pip install .), or stage from a checkout.")
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    sha = digest.hexdigest()[:16]
    bundle = CodeBundle(sha=sha, uri=join(output_root, "_code", sha), lock=lock_name,
                        lock_sha=hashlib.sha256(lock).hexdigest()[:16], tensorflow=runtime.tensorflow,
                        pod=runtime.pod)
    marker = join(bundle.uri, "_SUCCESS")
    if not storage.exists(marker):
        storage.write_bytes(join(bundle.uri, "mlm_tasks.tar.gz"), _tarball(files))
        storage.write_text(marker, bundle.sha)  # last: a bundle with a marker is complete
    return bundle


def _shell_path(path: str) -> str:
    """Quote a path but keep a leading ~ meaning the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _fetch(py: str, uri: str) -> str:
    """Shell that copies the bundle's tarball from `uri` into the current directory. gs:// goes
    through the image's own TensorFlow (its GCS filesystem uses the VM's service account), so the
    VM needs nothing else, not even gcloud."""
    tarball = join(uri, "mlm_tasks.tar.gz")
    if storage.scheme(uri) == "gs":
        copy = "import sys, tensorflow as tf; tf.io.gfile.copy(sys.argv[1], sys.argv[2], overwrite=True)"
        return f"{py} -c {shlex.quote(copy)} {shlex.quote(tarball)} mlm_tasks.tar.gz"
    return f"cp {shlex.quote(storage.local_path(tarball))} ."


def _bootstrap(cfg: PipelineConfig, code: CodeBundle) -> list[str]:
    py = shlex.quote(cfg.tpu.python)
    deps = f"deps-{code.lock_sha}"
    unpack = " && ".join([
        _fetch(py, code.uri),
        f"rm -rf code.tmp && mkdir code.tmp && tar -xzf mlm_tasks.tar.gz -C code.tmp && rm -rf code && mv code.tmp code",
        f"touch .installed-{code.sha}",
    ])
    # --no-deps: the lock is complete beside the image's packages, and must never pull PyPI's
    # TensorFlow (tf-keras asks for `tensorflow`, which the image's TPU build may not be named).
    install = " && ".join([
        f"rm -rf {deps}.tmp",
        f"{py} -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: "
        f"--target {deps}.tmp -r code/{shlex.quote(code.lock)}",
        # Once per lock: the image must hold the runtime's TensorFlow and whatever the lock needs.
        f"PYTHONPATH=\"$PWD/code:$PWD/{deps}.tmp\" {py} -m mlm_tasks.vm.check_image "
        f"{shlex.quote(code.tensorflow)} {deps}.tmp" + (" --pod" if code.pod else ""),
        f"mv {deps}.tmp {deps}",
    ])
    # `set -e` ignores a failure inside an && chain: each chain says so and exits itself.
    return [
        f"if [ ! -f .installed-{code.sha} ]; then echo 'Installing project {code.sha} in '\"$PWD\"; "
        f"{unpack} || {{ echo 'Fetching the staged code from {code.uri} failed (see above): check that the "
        "VM can read the bucket (its service account needs storage access).' >&2; exit 3; }; fi",
        f"if [ ! -d {deps} ]; then echo 'Installing {Path(code.lock).name} beside the image TensorFlow'; "
        f"{install} || {{ echo 'Installing the VM lock failed (see above): the VM needs the package index "
        "(external IP or Cloud NAT), and tpu.runtime_version must name the image it runs.' >&2; exit 3; }; fi",
        f'export PYTHONPATH="$PWD/code:$PWD/{deps}${{PYTHONPATH:+:$PYTHONPATH}}"',
    ]


def step_environment(cfg: PipelineConfig, node: str) -> dict[str, str]:
    """What the remote line exports before anything imports TensorFlow: the runtime's variables
    (mlm_tasks.vm.runtimes.ENVIRONMENT: PJRT's pluggable device on one host, TPU_LOAD_LIBRARY=0 on a
    pod), the slice's node name on a pod (train: TPUClusterResolver(tpu=<node>, zone, project)),
    then the project's own, then tpu.env."""
    from mlm_tasks.vm import runtimes

    runtime = runtimes.get(cfg.tpu.runtime_version)
    variables = {**runtimes.environment(runtime), **VM_ENV}
    if runtime.pod:
        variables["MLM_TPU_NODE"] = node
    return {**variables, **cfg.tpu.env}


def remote_command(cfg: PipelineConfig, step: str, run_id: str, *, node: str, extra_args: Sequence[str] = (),
                   code: CodeBundle | None = None, env: dict[str, str] | None = None,
                   expect_token: bool = False) -> str:
    """The shell line worker 0 of TPU VM `node` runs: [install once] then `python -m mlm_tasks <step> ...`.
    `env`: more (non-secret) variables for the step, e.g. the Hub endpoint.
    `expect_token`: the session sends the Hub token; fail at once, saying why, if it did not arrive."""
    if cfg.tpu.bootstrap and code is None:
        raise ConfigError("tpu.bootstrap is on but no code bundle was given: call stage_code() first, "
                          "or set tpu.bootstrap=false when the VM already has the project in tpu.workdir.")
    config_json = json.dumps(cfg.model_dump(mode="json"), separators=(",", ":"))
    step_line = " ".join(shlex.quote(a) for a in [cfg.tpu.python, "-m", "mlm_tasks", step, "--config-json",
                                                    config_json, "--run-id", run_id, *extra_args])
    variables = {**step_environment(cfg, node), **(env or {})}
    bad = [k for k in variables if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ConfigError(f"tpu.env has invalid variable names {bad}: use letters, digits and _.")
    parts = ["set -e", f"mkdir -p {_shell_path(cfg.tpu.workdir)}", f"cd {_shell_path(cfg.tpu.workdir)}"]
    parts += [f"export {k}={shlex.quote(v)}" for k, v in sorted(variables.items())]
    # The token arrives in the session's environment, never in this line; hand it on under its own name.
    if expect_token:  # an sshd that does not accept the name drops it without a word
        parts.append(f'if [ -z "${{{SESSION_ENV_TOKEN}:-}}" ]; then echo "The Hub token did not reach the VM: its '
                     f'sshd_config needs AcceptEnv LANG LC_* (Ubuntu\'s default) for {SESSION_ENV_TOKEN}." >&2; exit 3; fi')
    parts.append(f'if [ -n "${{{SESSION_ENV_TOKEN}:-}}" ]; then export HF_TOKEN="${SESSION_ENV_TOKEN}"; fi; '
                 f"unset {SESSION_ENV_TOKEN}")
    if cfg.tpu.bootstrap:
        parts += _bootstrap(cfg, code)
    # exec: the step replaces the shell, so a hang-up of the SSH session (task killed) reaches it.
    parts.append(f"exec {step_line}")
    return "; ".join(parts)
