"""The TensorFlow TPU VM runtimes this project supports, and the VM lock each one installs.

    from mlm_tasks.vm import runtimes
    rt = runtimes.get("tpu-vm-tf-2.16.1-pjrt")   # Runtime(tensorflow="2.16.1", python="3.10", pod=False)
    rt.lock_path                                   # .../mlm_tasks/vm/requirements-tf2.16.txt

A runtime image (`tpu-vm-tf-X.Y.Z[-pod]-pjrt`) is Ubuntu 22.04 with Python 3.10 and a TPU build of
TensorFlow X.Y.Z preinstalled; the VM lock holds only what runs beside that TensorFlow (never
TensorFlow itself). `-pod` images are for multi-host slices, where TensorFlow is single-client:
worker 0 runs the program and the `-pod` runtime on the other hosts serves it.

Checked against Google's pages: "TPU software versions" (cloud.google.com/tpu/docs/runtimes) gives
the naming rule `tpu-vm-tf-x.y.z[-pod][-{pjrt|se}]` (-pod for multi-host slices) and says v5e, v5p
and v6e run TensorFlow 2.15.0 or later with PJRT; "TPU runtimes" (.../supported-tpu-versions) lists
the TensorFlow TPU VM versions tpu-vm-tf-2.16.1-pjrt, 2.16.1-se, 2.15.1-pjrt/-se, 2.15.0-pjrt/-se,
then 2.14.1 and older. Newer TensorFlow runtimes, if Google adds any, need a row and a lock here. Supported here is what has a VM lock and is tested on the simulated image
(tests/plugins/test_simulated_tpu_vm.py): the 2.16.1 PJRT runtimes. Adding one = a row, a lock
(`make lock-vm`), and the simulated test on its TensorFlow.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlm_tasks.config import ConfigError

HERE = Path(__file__).resolve().parent
NAME = re.compile(r"^tpu-vm-tf-(?P<tf>\d+\.\d+\.\d+)(?P<pod>-pod)?(?:-(?P<api>pjrt|se))?$")


@dataclass(frozen=True)
class Runtime:
    version: str       # the TPU API's runtime_version
    tensorflow: str    # the image's TensorFlow (TPU build)
    python: str        # the image's Python
    pod: bool          # -pod image: for multi-host slices (program on worker 0 only)

    @property
    def tf_minor(self) -> str:
        return self.tensorflow.rsplit(".", 1)[0]

    @property
    def lock_path(self) -> Path:
        """Locked requirements installed beside the image's TensorFlow (package data)."""
        return HERE / f"requirements-tf{self.tf_minor}.txt"

    @property
    def image_path(self) -> Path:
        """What the image is taken to preinstall: TensorFlow and its own dependencies (the
        simulated image installs exactly this; the VM lock never touches these packages)."""
        return HERE / f"image-tf{self.tf_minor}.txt"


def _both(tensorflow: str) -> list[Runtime]:
    return [Runtime(f"tpu-vm-tf-{tensorflow}{pod}-pjrt", tensorflow, "3.10", bool(pod)) for pod in ("", "-pod")]


SUPPORTED: dict[str, Runtime] = {rt.version: rt for rt in _both("2.16.1")}
DEFAULT = "tpu-vm-tf-2.16.1-pjrt"
# Listed by Google but without a VM lock here (older TensorFlow, or the stream-executor API).
PUBLISHED_UNSUPPORTED = ("tpu-vm-tf-2.16.1-se", "tpu-vm-tf-2.15.1-pjrt", "tpu-vm-tf-2.15.1-se",
                         "tpu-vm-tf-2.15.0-pjrt", "tpu-vm-tf-2.15.0-se", "tpu-vm-tf-2.14.1", "tpu-vm-tf-2.14.0")


def get(version: str) -> Runtime:
    """The supported runtime `version`, or a ConfigError that says which ones are."""
    if version in SUPPORTED:
        return SUPPORTED[version]
    choices = ", ".join(sorted(SUPPORTED))
    if version in PUBLISHED_UNSUPPORTED or NAME.match(version):
        raise ConfigError(f"tpu.runtime_version {version!r} has no VM lock in this project (its TensorFlow "
                          f"or device API is not one it is tested on): use one of {choices}.")
    raise ConfigError(f"tpu.runtime_version {version!r} is not a TensorFlow TPU VM runtime "
                      f"(tpu-vm-tf-X.Y.Z[-pod]-pjrt): use one of {choices}.")


def oldest() -> Runtime:
    return min(SUPPORTED.values(), key=lambda rt: tuple(int(p) for p in rt.tensorflow.split(".")))
