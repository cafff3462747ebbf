"""Run on the TPU VM right after the VM lock is installed: is this image what the lock was made for?

    PYTHONPATH=code:deps-<sha>.tmp python -m mlm_tasks.vm.check_image 2.16.1 deps-<sha>.tmp

Checks that the image's TensorFlow has the runtime's minor version, that every requirement of every
locked package is met by the image's packages (numpy, protobuf, ...) or the lock itself — the lock
is installed with `pip --no-deps`, so nobody else checks — and that the VM side imports: tf-keras,
transformers (seeing TensorFlow), gcsfs, the storage client. Exits non-zero with what to do.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unmet_requirements(deps_dir: str, tf_version: str) -> list[str]:
    """Requirements of the packages in `deps_dir` that nothing importable here satisfies. The image's
    TPU TensorFlow may carry another distribution name (tensorflow-tpu): `tensorflow` means it."""
    from packaging.requirements import Requirement

    have = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    have["tensorflow"] = tf_version
    problems = []
    for dist in metadata.distributions(path=[deps_dir]):
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue  # an optional extra, or another platform / Python
            found = have.get(_norm(req.name))
            if found is None or not req.specifier.contains(found, prereleases=True):
                problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}; the VM has "
                                f"{found or 'nothing'}")
    return problems


def main(argv: list[str]) -> int:
    want, deps_dir = argv
    import tensorflow as tf

    if tf.__version__.rsplit(".", 1)[0] != want.rsplit(".", 1)[0]:
        print(f"This TPU VM image has TensorFlow {tf.__version__}, but tpu.runtime_version promises {want}: set "
              "tpu.runtime_version to the image's runtime (it chooses the VM lock).", file=sys.stderr)
        return 1
    problems = unmet_requirements(deps_dir, tf.__version__)
    if problems:
        print("The VM lock does not fit this image:\n  " + "\n  ".join(problems) + "\nRe-lock for the image "
              "(make lock-vm) or pick the runtime the lock was made for.", file=sys.stderr)
        return 1
    import gcsfs  # noqa: F401
    import tf_keras
    import transformers
    from google.cloud import storage  # noqa: F401

    if not transformers.is_tf_available():
        print("transformers does not see TensorFlow: FORCE_TF_AVAILABLE=1 must be set for the step.", file=sys.stderr)
        return 1
    print(f"VM ready: Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, tf-keras {tf_keras.__version__}, "
          f"transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
