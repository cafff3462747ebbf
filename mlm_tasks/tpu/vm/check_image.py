"""Run on the TPU VM right after the VM lock is installed: is this image what the lock was made for?
(docs/google-cloud.md: what it checks.) Exits non-zero with what to do.

    PYTHONPATH=code:deps-<sha>.tmp python -m mlm_tasks.tpu.vm.check_image 2.16.1 deps-<sha>.tmp [--pod]
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

TENSORFLOW_NAMES = ("tensorflow", "tensorflow-tpu", "tensorflow-cpu")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def importable() -> dict[str, metadata.Distribution]:
    """Each distribution Python would import, by normalised name: the first on sys.path wins, as it
    does for imports (a package of the lock shadows the image's copy)."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            found.setdefault(_norm(dist.metadata["Name"]), dist)
    return found


def _unmet(dist: metadata.Distribution, have: dict[str, str]) -> list[str]:
    from packaging.requirements import Requirement

    problems = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or another platform / Python
        found = have.get(_norm(req.name))
        if found is None or not req.specifier.contains(found, prereleases=True):
            problems.append(f"{dist.metadata['Name']} {dist.version} needs {req}; the VM has {found or 'nothing'}")
    return problems


def unmet_requirements(deps_dir: str, tf_version: str) -> list[str]:
    """Requirements of the packages in `deps_dir` and of the image's TensorFlow that nothing importable here
    satisfies (a TPU build named tensorflow-tpu counts as `tensorflow`)."""
    dists = importable()
    have = {name: dist.version for name, dist in dists.items()}
    have["tensorflow"] = tf_version
    problems = []
    for dist in metadata.distributions(path=[deps_dir]):
        problems += _unmet(dist, have)
    for name in TENSORFLOW_NAMES:  # TensorFlow's own bounds hold for what the lock shadows too
        if name in dists:
            problems += _unmet(dists[name], have)
    return problems


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    pod = "--pod" in argv
    want, deps_dir = [a for a in argv if a != "--pod"]
    import tensorflow as tf

    if tf.__version__.rsplit(".", 1)[0] != want.rsplit(".", 1)[0]:
        return _fail(
            f"This TPU VM image has TensorFlow {tf.__version__}, but tpu.runtime_version promises {want}: set "
            "tpu.runtime_version to the image's runtime (it chooses the VM lock)."
        )
    problems = unmet_requirements(deps_dir, tf.__version__)
    if problems:
        return _fail(
            "The VM lock does not fit this image:\n  " + "\n  ".join(problems) + "\nRe-lock for the image "
            "(make lock-vm; python -m mlm_tasks.commands.smoke --capture-image records a real image's packages) or "
            "pick the runtime the lock was made for."
        )
    # What the steps on the VM import: train, and evaluate, downstream and fill_mask (the model judged there).
    import datasets  # hf_dataset corpora and downstream tasks
    import gcsfs  # noqa: F401
    import gensim.corpora.wikicorpus  # noqa: F401  Wikipedia corpora (downstream's held-out task, contamination)
    import google.cloud.storage  # noqa: F401
    import tf_keras
    import transformers
    from transformers import pipeline  # noqa: F401  fill_mask's

    if not transformers.is_tf_available():
        return _fail("transformers does not see TensorFlow: FORCE_TF_AVAILABLE=1 must be set for the step.")
    if pod:
        # TPUClusterResolver(tpu=<node>) raises "Missing runtime dependency on the Google API client"
        # at the first training step without these: find out now, before the slice trains.
        from tensorflow.python.tpu.client import client as tpu_client

        if not tpu_client._GOOGLE_API_CLIENT_INSTALLED:  # TensorFlow's own switch
            return _fail(
                "The TPU client TPUClusterResolver needs on a pod (googleapiclient, oauth2client) does not "
                "import: the VM lock must carry google-api-python-client and oauth2client."
            )
    print(
        f"VM ready: Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, tf-keras {tf_keras.__version__}, "
        f"transformers {transformers.__version__}, datasets {datasets.__version__}"
        + (", TPU client for the pod" if pod else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
