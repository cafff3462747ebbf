"""The TPU VM's side of the project: the runtime table, the VM lock, and staging from any install.

    python -m pytest tests/mlm_tasks/test_tpu_remote.py -q

The lock check resolves the committed VM lock with the image's TensorFlow for the image's Python
(`uv pip compile --python-version 3.10`, PyPI through uv's cache): a new pin that the image's
TensorFlow cannot live with fails here, not on a TPU VM.
"""
from __future__ import annotations

import gzip
import io
import re
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.paths import join
from mlm_tasks.tpu_remote import _run_lock, remote_command, run_lock_name, stage_code
from mlm_tasks.vm import runtimes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import lock_vm  # noqa: E402


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split(";")[0].strip() for line in path.read_text().splitlines()
             if "==" in line and not line.lstrip().startswith("#")]
    return {lock_vm.name_of(line): line.split("==", 1)[1] for line in lines}


def test_default_runtime_is_supported_and_single_host():
    default = PipelineConfig().tpu.runtime_version
    assert default == runtimes.DEFAULT
    rt = runtimes.get(default)
    assert (rt.tensorflow, rt.python, rt.pod) == ("2.16.1", "3.10", False)
    assert runtimes.get("tpu-vm-tf-2.16.1-pod-pjrt").pod
    # Every supported name follows Google's scheme tpu-vm-tf-x.y.z[-pod]-pjrt with its own TF version.
    for version, rt in runtimes.SUPPORTED.items():
        found = runtimes.NAME.match(version)
        assert found and found["tf"] == rt.tensorflow and bool(found["pod"]) == rt.pod and found["api"] == "pjrt"


@pytest.mark.parametrize("version, message", [
    ("tpu-vm-tf-2.15.0-pjrt", "has no VM lock in this project"),
    ("tpu-vm-tf-2.21.0-pjrt", "has no VM lock in this project"),   # the Airflow side's TF: no such image
    ("v2-alpha-tpuv5-lite", "is not a TensorFlow TPU VM runtime"),
])
def test_unsupported_runtimes_are_refused_with_the_choices(version, message):
    with pytest.raises(ConfigError, match=message) as err:
        runtimes.get(version)
    assert "tpu-vm-tf-2.16.1-pjrt" in str(err.value)
    with pytest.raises(ValueError, match=message):
        PipelineConfig.model_validate({"tpu": {"runtime_version": version}})


def test_vm_lock_leaves_the_image_alone():
    """The lock never names TensorFlow or anything the image's TensorFlow brings (numpy, protobuf,
    ml-dtypes...), and holds what the VM runs, with the Airflow side's versions where they meet."""
    airflow_side = _pins(ROOT / "requirements.txt")
    for rt in {r.tf_minor: r for r in runtimes.SUPPORTED.values()}.values():
        lock, image = _pins(rt.lock_path), _pins(rt.image_path)
        assert image["tensorflow"] == rt.tensorflow and not set(lock) & set(image)
        assert not {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "keras", "numpy", "protobuf"} & set(lock)
        assert lock["tf-keras"].rsplit(".", 1)[0] == rt.tf_minor  # Keras 2 of the image's TF minor
        for name in ("transformers", "tokenizers", "huggingface-hub", "pydantic"):
            assert lock[name] == airflow_side[name], name
        for name in ("pyyaml", "gcsfs", "google-cloud-storage", "google-crc32c", "fsspec"):
            assert name in lock, name


def test_vm_lock_resolves_with_the_image_tensorflow():
    for rt in {r.tf_minor: r for r in runtimes.SUPPORTED.values()}.values():
        resolved = {lock_vm.name_of(line): line.split("==", 1)[1] for line in lock_vm.check(rt)}
        assert resolved["tensorflow"] == rt.tensorflow
        assert {k: v for k, v in resolved.items() if k in _pins(rt.lock_path)} == _pins(rt.lock_path)


def _members(root: str, sha: str) -> dict[str, bytes]:
    data = gzip.decompress(storage.read_bytes(join(root, "_code", sha, "mlm_tasks.tar.gz")))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_a_non_editable_install_stages_what_the_checkout_stages(tmp_path):
    """A wheel / Docker install has no requirements.txt beside the package: the locks are package
    data, and stage_code reads the package from wherever it is installed."""
    site = tmp_path / "site"
    subprocess.run(["uv", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(ROOT)],
                   check=True, cwd=tmp_path)
    installed = tmp_path / "from-install"
    staged = subprocess.run(
        [sys.executable, "-c", "import sys, mlm_tasks.tpu_remote as t; print(t.PACKAGE_DIR); "
         f"print(t.stage_code(sys.argv[1], {runtimes.DEFAULT!r}).sha)", str(installed)],
        cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert staged.returncode == 0, staged.stderr
    package_dir, sha = staged.stdout.split()
    assert package_dir == str(site / "mlm_tasks")  # really the installed copy, not this checkout

    checkout = stage_code(str(tmp_path / "from-checkout"), runtimes.DEFAULT)
    assert sha == checkout.sha
    files = _members(str(installed), sha)
    assert files == _members(str(tmp_path / "from-checkout"), checkout.sha)
    assert checkout.lock in files and "mlm_tasks/vm/runtimes.py" in files


def test_staging_without_the_locks_says_what_to_do(tmp_path):
    package = tmp_path / "mlm_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    with pytest.raises(ConfigError, match="lacks its package data"):
        stage_code(str(tmp_path / "out"), runtimes.DEFAULT, package_dir=package)


def test_vm_side_modules_compile_for_python_310():
    """Everything the VM imports must parse on the image's Python (the simulated-VM test runs it)."""
    from peers.tpu_vm_image import python_310

    python = python_310()  # no Python 3.10: fails saying how to install it, as the simulated-VM test does
    files = [str(p) for p in (ROOT / "mlm_tasks").rglob("*.py")]
    out = subprocess.run([str(python), "-c", "import ast, sys\nfor f in sys.argv[1:]: ast.parse(open(f).read(), f)",
                          *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_image_check_finds_what_the_image_lacks(tmp_path):
    """pip --no-deps checks nothing: check_image does, with `tensorflow` met by the image's TPU build
    whatever its distribution name."""
    from mlm_tasks.vm.check_image import unmet_requirements

    info = tmp_path / "demo_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n"
                                   "Requires-Dist: tensorflow<2.17,>=2.16\nRequires-Dist: numpy>=99\n"
                                   "Requires-Dist: pydantic\nRequires-Dist: torch; extra == \"torch\"\n"
                                   "Requires-Dist: pywin32; sys_platform == \"win32\"\n")
    problems = unmet_requirements(str(tmp_path), "2.16.1")
    assert len(problems) == 1 and problems[0].startswith("demo-pkg 1.0 needs numpy>=99; the VM has ")
    assert any("tensorflow" in p for p in unmet_requirements(str(tmp_path), "2.21.0"))


def test_the_remote_line_takes_the_run_lock_just_before_the_step():
    """One step per run: the lock is named by a hash (the run id never reaches a path) and taken on
    fd 9 in the shell that then execs the step, so the step holds it."""
    run_id = "manual__2025-01-01T00:00:00+00:00'; touch /tmp/pwned #"
    cfg = PipelineConfig.model_validate({"tpu": {"bootstrap": False, "workdir": "/w"}})
    setup, step = remote_command(cfg, "train", run_id).rsplit("; exec ", 1)
    lock = run_lock_name(run_id, "train")
    assert re.fullmatch(r"\.run-lock-[0-9a-f]{16}", lock)
    assert len({lock, run_lock_name(run_id, "evaluate"), run_lock_name("manual__2", "train")}) == 3
    lines = _run_lock("train", run_id)
    assert setup.endswith("; " + "; ".join(lines))  # last before the step: a merge of other lines stays trivial
    assert lines[0].startswith(f"if ! {{ exec 9>>{lock} && flock -n 9; }}; then ") and lines[1] == f"echo $$ > {lock}.pid"
    assert "Stopping the \"trainer\" left by an earlier try (pid $pid)" in setup and "exit 3" in setup
    assert run_id not in setup and shlex.split(step)[-2:] == ["--run-id", run_id]
    assert subprocess.run(["sh", "-n", "-c", f"{setup}; exec {step}"]).returncode == 0  # parses as sh


def test_a_step_that_ignores_sigterm_is_killed(tmp_path):
    """The lock lines with sh on this machine (the SSH path is in tests/plugins/test_remote_step_retry.py):
    an earlier try's step that ignores SIGTERM is killed after the grace time, and the new one runs."""
    stub = tmp_path / "step"
    stub.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do echo \"$$\" >> writes; sleep 0.1; done\n")
    stub.chmod(0o755)
    line = f"set -e; cd {shlex.quote(str(tmp_path))}; " + "; ".join(_run_lock("train", "r 1", grace_s=1))
    earlier = subprocess.Popen(["setsid", "sh", "-c", f"{line}; exec ./step"])  # setsid: as sshd starts a session
    try:
        while not (tmp_path / "writes").exists():
            time.sleep(0.05)
        retry = subprocess.run(["sh", "-c", f"{line}; echo started"], capture_output=True, text=True, timeout=30)
        assert retry.returncode == 0, retry.stderr
        assert retry.stdout.splitlines() == [
            f"Stopping the trainer left by an earlier try (pid {earlier.pid}) of this run: SIGTERM, then SIGKILL "
            "after 1s.", f"pid {earlier.pid} still runs after 1s: SIGKILL.",
            "The earlier try stopped: starting this one.", "started"]
        assert earlier.wait(timeout=5) == -9
    finally:
        earlier.kill()
