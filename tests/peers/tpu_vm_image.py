"""A simulated TPU VM image: a fresh Python 3.10 environment holding what `tpu-vm-tf-X.Y.Z-pjrt`
preinstalls — TensorFlow X.Y.Z and its own dependencies (mlm_tasks/vm/image-tfX.Y.txt), from PyPI.

    python tests/peers/tpu_vm_image.py          # build it (make tpuvm-env); tests build it on demand
    tpu_vm_python                                # session fixture: path of that environment's python

PyPI's CPU TensorFlow stands in for the image's TPU build: the same Python API. Like the TPU build,
it is registered under the distribution name `tensorflow-tpu`, so whatever keys on distribution
names (pip resolving tf-keras' `tensorflow` requirement, transformers' TensorFlow detection) sees
what it would see on the image. Built with uv into `<repo>/.venv-tpuvm/` and reused while the image
file is unchanged (warm uv cache: seconds; cold: one ~600 MB TensorFlow download).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mlm_tasks.vm import runtimes  # noqa: E402

VENV = ROOT / ".venv-tpuvm"
PYENV_310 = Path("/root/.pyenv/versions/3.10.13/bin/python")
TPU_DIST = "tensorflow-tpu"


def python_310() -> str:
    if PYENV_310.exists():
        return str(PYENV_310)
    for name in ("python3.10",):
        if shutil.which(name):
            return shutil.which(name)
    raise RuntimeError("No Python 3.10 for the simulated TPU VM: install it (pyenv install 3.10.13) as the "
                       "TPU VM images (Ubuntu 22.04) have it.")


def _rename_tensorflow(venv: Path) -> None:
    """Register the installed tensorflow as `tensorflow-tpu`, the TPU build's distribution name."""
    (site,) = venv.glob("lib/python3.10/site-packages")
    (dist,) = site.glob("tensorflow-*.dist-info")
    meta = dist / "METADATA"
    text = meta.read_text().replace("Name: tensorflow\n", f"Name: {TPU_DIST}\n", 1)
    meta.unlink()  # a new file, never an edit through a hard link into uv's cache
    meta.write_text(text)
    dist.rename(site / dist.name.replace("tensorflow-", "tensorflow_tpu-", 1))


def build(runtime: runtimes.Runtime | None = None, venv: Path = VENV) -> Path:
    """The simulated image's python, built unless the same image is already there."""
    runtime = runtime or runtimes.get(runtimes.DEFAULT)
    image = runtime.image_path.read_bytes()
    stamp = hashlib.sha256(image + b"rename:" + TPU_DIST.encode()).hexdigest()
    marker = venv / ".image"
    python = venv / "bin" / "python"
    if marker.exists() and marker.read_text() == stamp and python.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run(["uv", "venv", "--quiet", "--seed", "--python", python_310(), str(venv)], check=True)
    # --no-deps: the image file is complete (TensorFlow's whole closure), as the image is. Copies, not
    # uv's default hard links: the rename below must not rewrite the wheel cached for other installs.
    subprocess.run(["uv", "pip", "install", "--quiet", "--no-deps", "--link-mode", "copy",
                    "-r", str(runtime.image_path)],
                   check=True, env=env)
    _rename_tensorflow(venv)
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
    print(build())
