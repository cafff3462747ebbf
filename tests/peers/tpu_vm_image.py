"""A simulated TPU VM image, as released: a fresh Python 3.10 environment holding exactly what
`tpu-vm-tf-X.Y.Z[-pod]-pjrt` preinstalls — TensorFlow X.Y.Z under its own wheel name `tensorflow`
and its own dependencies as of the runtime's release (mlm_tasks/tpu/vm/image-tfX.Y.txt, resolved with
`uv --exclude-newer <image_date>` or captured from a real VM), from PyPI.

    python tests/peers/tpu_vm_image.py [RUNTIME]   # build it (make tpuvm-env); tests build it on demand
    tpu_vm_python                                  # session fixture: the default runtime's python
    build(runtimes.get("tpu-vm-tf-2.17.0-pjrt"))   # another runtime's image

PyPI's CPU TensorFlow stands in for the image's TPU build: the same Python API and the same wheel
name. Built with uv into `<repo>/.venv-tpuvm/tfX.Y/` and reused while the image file is unchanged
(warm uv cache: seconds; cold: one ~600 MB TensorFlow download).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mlm_tasks.tpu import runtimes  # noqa: E402

VENVS = ROOT / ".venv-tpuvm"
# The image's /lib/libtpu.so, which PJRT's TF_PLUGGABLE_DEVICE_LIBRARY_PATH names (runtimes.ENVIRONMENT),
# is the one thing a simulated worker cannot have: put this in tpu.env, and its CPU TensorFlow loads no
# plugin (an empty value is TensorFlow's "none") instead of failing on the missing file.
NO_LIBTPU = {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": ""}
PYENV_310 = Path("/root/.pyenv/versions/3.10.13/bin/python")


def python_310() -> str:
    if PYENV_310.exists():
        return str(PYENV_310)
    for name in ("python3.10",):
        if shutil.which(name):
            return shutil.which(name)
    raise RuntimeError(
        "No Python 3.10 for the simulated TPU VM: install it (pyenv install 3.10.13) as the "
        "TPU VM images (Ubuntu 22.04) have it."
    )


def build(runtime: runtimes.Runtime | None = None) -> Path:
    """The simulated image's python, built unless the same image is already there."""
    runtime = runtime or runtimes.get(runtimes.DEFAULT)
    venv = VENVS / f"tf{runtime.tf_minor}"
    stamp = hashlib.sha256(runtime.image_path.read_bytes()).hexdigest()
    VENVS.mkdir(exist_ok=True)
    # pytest-xdist workers build it at once: one builds, the others wait and reuse it.
    with open(VENVS / f".tf{runtime.tf_minor}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(runtime, venv, stamp)


def _build(runtime: runtimes.Runtime, venv: Path, stamp: str) -> Path:
    marker = venv / ".image"
    python = venv / "bin" / "python"
    if marker.exists() and marker.read_text() == stamp and python.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run(["uv", "venv", "--quiet", "--python", python_310(), str(venv)], check=True)
    # --no-deps: the image file is complete (TensorFlow's whole closure), as the image is. The image's
    # pip (the bootstrap installs the VM lock with it) is the one of its day too.
    subprocess.run(["uv", "pip", "install", "--quiet", "--no-deps", "-r", str(runtime.image_path)], check=True, env=env)
    if not (venv / "bin" / "pip").exists():
        subprocess.run(
            ["uv", "pip", "install", "--quiet", "--exclude-newer", runtime.image_date, "pip"], check=True, env=env
        )
    marker.write_text(stamp)
    return python


try:
    import pytest
except ImportError:
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def tpu_vm_python() -> str:
        return str(build())


if __name__ == "__main__":
    print(build(runtimes.get(sys.argv[1]) if len(sys.argv) > 1 else None))
