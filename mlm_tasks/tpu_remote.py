"""What runs on each TPU VM worker: an idempotent install of this project, then one CLI step.

    bundle = stage_code(cfg.output_root)                    # once, from the Airflow worker
    line = remote_command(cfg, "train", run_id, code=bundle) # the same line runs on every worker

`stage_code` puts a deterministic tarball of the `mlm_tasks` package plus requirements.txt under
output_root/_code/<sha>/ (content-addressed: an unchanged project is uploaded once). The remote line
fetches and installs it only when `<workdir>/.installed-<sha>` is missing, then runs
`python -m mlm_tasks <step> --config-json <cfg> --run-id <run>`. With `tpu.bootstrap: false` it
just runs the step from `tpu.workdir` (a custom image, or the tests, where the "VM" is this machine).
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
# The TPU image's TensorFlow is built for the TPU runtime: never replace it from requirements.txt.
KEEP_FROM_IMAGE = r"^(tensorflow|tensorflow-cpu|tf-keras|tensorboard|libtpu|keras)([=<>~ ;\[]|$)"


@dataclass(frozen=True)
class CodeBundle:
    sha: str   # content hash of the package and requirements
    uri: str   # folder holding mlm_tasks.tar.gz and requirements.txt


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


def stage_code(output_root: str, package_dir: Path = PACKAGE_DIR,
               requirements: Path | None = None) -> CodeBundle:
    """Upload the package and requirements to output_root/_code/<sha>/ unless already there."""
    requirements = requirements or package_dir.parent / "requirements.txt"
    if not requirements.exists():
        raise ConfigError(f"{requirements} is missing: the TPU VM installs the project's pinned "
                          "requirements from it. Run from the project checkout.")
    files = _package_files(package_dir)
    req = requirements.read_bytes()
    digest = hashlib.sha256()
    for name, data in [*files, ("requirements.txt", req)]:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    bundle = CodeBundle(sha=digest.hexdigest()[:16], uri=join(output_root, "_code", digest.hexdigest()[:16]))
    marker = join(bundle.uri, "_SUCCESS")
    if not storage.exists(marker):
        storage.write_bytes(join(bundle.uri, "mlm_tasks.tar.gz"), _tarball(files))
        storage.write_bytes(join(bundle.uri, "requirements.txt"), req)
        storage.write_text(marker, bundle.sha)  # last: a bundle with a marker is complete
    return bundle


def _shell_path(path: str) -> str:
    """Quote a path but keep a leading ~ meaning the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _fetch(uri: str) -> str:
    """Shell that copies the bundle files from `uri` into the current directory."""
    files = [join(uri, "mlm_tasks.tar.gz"), join(uri, "requirements.txt")]
    if storage.scheme(uri) == "gs":
        quoted = " ".join(shlex.quote(f) for f in files)
        return (f"if command -v gcloud >/dev/null; then gcloud storage cp {quoted} .; "
                f"else gsutil -q cp {quoted} .; fi")
    return "cp " + " ".join(shlex.quote(storage.local_path(f)) for f in files) + " ."


def _bootstrap(cfg: PipelineConfig, code: CodeBundle) -> str:
    py = shlex.quote(cfg.tpu.python)
    marker = f".installed-{code.sha}"
    install = " && ".join([
        _fetch(code.uri),
        "rm -rf code && mkdir code && tar -xzf mlm_tasks.tar.gz -C code",
        f"(grep -v -i -E {shlex.quote(KEEP_FROM_IMAGE)} requirements.txt > requirements-vm.txt || true)",
        f"{py} -m pip install --quiet -r requirements-vm.txt",
        # tf-keras must match the image's TensorFlow minor version, so it is chosen here, not pinned.
        f"(! grep -q -i '^tf-keras' requirements.txt || {py} -m pip install --quiet \"tf-keras~=$({py} -c "
        "'import tensorflow as tf; print(tf.__version__.rsplit(\".\", 1)[0])').0\")",
        f"touch {marker}",
    ])
    return f"if [ ! -f {marker} ]; then echo 'Installing project {code.sha} in '\"$PWD\"; {install}; fi"


def remote_command(cfg: PipelineConfig, step: str, run_id: str, *, extra_args: Sequence[str] = (),
                   code: CodeBundle | None = None) -> str:
    """The shell line each worker runs: [install once] then `python -m mlm_tasks <step> ...`."""
    if cfg.tpu.bootstrap and code is None:
        raise ConfigError("tpu.bootstrap is on but no code bundle was given: call stage_code() first, "
                          "or set tpu.bootstrap=false when the VM already has the project in tpu.workdir.")
    config_json = json.dumps(cfg.model_dump(mode="json"), separators=(",", ":"))
    step_line = " ".join(shlex.quote(a) for a in [cfg.tpu.python, "-m", "mlm_tasks", step, "--config-json",
                                                    config_json, "--run-id", run_id, *extra_args])
    bad = [k for k in cfg.tpu.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ConfigError(f"tpu.env has invalid variable names {bad}: use letters, digits and _.")
    parts = ["set -e", f"mkdir -p {_shell_path(cfg.tpu.workdir)}", f"cd {_shell_path(cfg.tpu.workdir)}",
             "export PYTHONUNBUFFERED=1"]  # worker 0's lines reach the task log as they happen
    parts += [f"export {k}={shlex.quote(v)}" for k, v in sorted(cfg.tpu.env.items())]
    if cfg.tpu.bootstrap:
        parts += [_bootstrap(cfg, code), 'export PYTHONPATH="$PWD/code${PYTHONPATH:+:$PYTHONPATH}"']
    # exec: the step replaces the shell, so a hang-up of the SSH session (task killed) reaches it.
    parts.append(f"exec {step_line}")
    return "; ".join(parts)
