"""The TensorFlow TPU VM runtimes this project supports: each one's image, VM lock and environment.

    rt = runtimes.get("tpu-vm-tf-2.16.1-pjrt")   # Runtime(tensorflow="2.16.1", python="3.10", pod=False, ...)
    rt.lock_path                                   # .../mlm_tasks/tpu/vm/requirements-tf2.16.txt

Images, sources and locks: docs/google-cloud.md#slices-runtimes-and-the-vm-install. Adding a runtime = a row
below, `make lock-vm`, and a parameter of tests/plugins/test_simulated_tpu_vm.py.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from mlm_tasks.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # mlm_tasks/
VM_DIR = PACKAGE_DIR / "tpu" / "vm"  # the VM locks and image files, shipped in the bundle
NAME = re.compile(
    r"^tpu-vm-tf-(?P<tf>\d+\.\d+\.\d+)(?P<pod>-pod)?(?:-(?P<api>pjrt|se))?"
    r"(?P<chips>-v5p-and-below|-v5e-and-v6)?$"
)
# Packages the VM lock may carry newer than the image, shadowing its copy on PYTHONPATH (the rest fits its pins).
SHADOWED = frozenset({"typing-extensions", "requests"})


@dataclass(frozen=True)
class Runtime:
    version: str  # the TPU API's runtime_version
    tensorflow: str  # the image's TensorFlow (TPU build)
    python: str  # the image's Python
    pod: bool  # -pod image: for multi-host slices (program on worker 0 only)
    libtpu: str  # the image's libtpu (Google's table)
    image_date: str  # packages as of this day (uv --exclude-newer); see `image_source`
    image_source: str  # why that day

    @property
    def tf_minor(self) -> str:
        return self.tensorflow.rsplit(".", 1)[0]

    @property
    def lock_path(self) -> Path:
        """Locked requirements installed beside the image's TensorFlow (package data)."""
        return VM_DIR / f"requirements-tf{self.tf_minor}.txt"

    @property
    def image_path(self) -> Path:
        """What the image preinstalls, TensorFlow included (the lock is resolved against these pins)."""
        return VM_DIR / f"image-tf{self.tf_minor}.txt"


def _both(tensorflow: str, libtpu: str, image_date: str, image_source: str) -> list[Runtime]:
    return [
        Runtime(f"tpu-vm-tf-{tensorflow}{pod}-pjrt", tensorflow, "3.10", bool(pod), libtpu, image_date, image_source)
        for pod in ("", "-pod")
    ]


SUPPORTED: dict[str, Runtime] = {
    rt.version: rt
    for rt in [
        *_both(
            "2.16.1",
            "1.10.1",
            "2024-04-29",
            "TensorFlow 2.16.1 with libtpu 1.10.1; a resolve as of that day gives what the released image "
            "holds: typing-extensions 4.11.0, protobuf 4.25.3, grpcio 1.62.2 (grpcio 1.63.0 came on April 30)",
        ),
        *_both(
            "2.17.0",
            "1.11.0",
            "2024-07-31",
            "TensorFlow 2.17.0 (PyPI: 2024-07-11) with libtpu 1.11.0; Google gives no date for the image: "
            "the end of its release month, until `tpu_smoke --capture-image` records the real set",
        ),
    ]
}


DEFAULT = "tpu-vm-tf-2.16.1-pjrt"


# Listed by Google but without a VM lock here, and why.
PUBLISHED_UNSUPPORTED = {
    "tpu-vm-tf-2.18.0-pjrt-v5p-and-below": "2.18.0 is split by chip family and has no lock here yet",
    "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6": "2.18.0 is split by chip family and has no lock here yet",
    "tpu-vm-tf-2.17.1-pjrt": "2.17.0 is the 2.17 runtime locked here",
    "tpu-vm-tf-2.16.1-se": "the stream-executor API: this project runs PJRT only",
    "tpu-vm-tf-2.15.1-pjrt": "older TensorFlow than any lock here",
    "tpu-vm-tf-2.15.0-pjrt": "older TensorFlow than any lock here",
}


# Google, Vertex AI "Train on TPUs": TensorFlow is not supported on v6e (Trillium) or later.
NO_TENSORFLOW = {
    "v6e": "Google's Vertex AI TPU page: TensorFlow is not supported on v6e (Trillium) and later TPUs, "
    "and tpu-vm-tf-2.16.1-pjrt does not see v6e devices"
}

# By pod: a (PJRT) runtime's variables before TensorFlow is first imported (sources: docs/google-cloud.md).
# One host: libtpu as a pluggable device (libtpu_probe finds it); a pod: the tpu-runtime service owns the chips.
ENVIRONMENT = {False: {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true"}, True: {"TPU_LOAD_LIBRARY": "0"}}
LIBTPU = "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"
# Where an image's libtpu lies (undocumented): /lib/libtpu.so on the 2.16 images, else the `libtpu` wheel.
LIBTPU_PATHS = ("/lib/libtpu.so",)
LIBTPU_PACKAGE = "import os, libtpu; print(os.path.join(os.path.dirname(libtpu.__file__), 'libtpu.so'))"


def libtpu_probe(runtime: Runtime, python: str) -> list[str]:
    """Shell that exports TF_PLUGGABLE_DEVICE_LIBRARY_PATH as the first libtpu found (LIBTPU_PATHS, then the
    `libtpu` package of `python`) on a single-host runtime, unless already set (tpu.env; empty: no plugin)."""
    if runtime.pod:
        return []
    paths = " ".join(shlex.quote(p) for p in LIBTPU_PATHS)
    missing = shlex.quote(
        f"No libtpu.so on this VM (looked in {', '.join(LIBTPU_PATHS)} and the libtpu package): TensorFlow will "
        f"not see the TPU. Set {LIBTPU} in tpu.env to where the image keeps it."
    )
    # </dev/null: the session's stdin may hold the Hub token, which only the step may read.
    return [
        f'if [ -z "${{{LIBTPU}+set}}" ]; then for f in {paths} "$({python} -c {shlex.quote(LIBTPU_PACKAGE)} '
        f'</dev/null 2>/dev/null)"; do if [ -f "$f" ]; then export {LIBTPU}="$f"; break; fi; done; '
        f'[ -n "${{{LIBTPU}+set}}" ] || echo {missing} >&2; fi'
    ]


def get(version: str) -> Runtime:
    """The supported runtime `version`, or a ConfigError that says which ones are."""
    if version in SUPPORTED:
        return SUPPORTED[version]
    choices = ", ".join(sorted(SUPPORTED))
    if version in PUBLISHED_UNSUPPORTED:
        raise ConfigError(
            f"tpu.runtime_version {version!r} is not supported here ({PUBLISHED_UNSUPPORTED[version]}): "
            f"use one of {choices}."
        )
    if NAME.match(version):
        raise ConfigError(
            f"tpu.runtime_version {version!r} has no VM lock in this project (its TensorFlow "
            f"or device API is not one it is tested on): use one of {choices}."
        )
    raise ConfigError(
        f"tpu.runtime_version {version!r} is not a TensorFlow TPU VM runtime "
        f"(tpu-vm-tf-X.Y.Z[-pod]-pjrt): use one of {choices}."
    )


def locks() -> list[Runtime]:
    """One runtime per TensorFlow minor: each minor has one image file and one VM lock."""
    return list({rt.tf_minor: rt for rt in SUPPORTED.values()}.values())
