"""The TPU VM's side of the project: the runtime table, the VM lock, and staging from any install.

    python -m pytest tests/mlm_tasks/tpu/test_bundle.py -q

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
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import join
from mlm_tasks.tpu import runtimes
from mlm_tasks.tpu.bundle import _run_lock, remote_command, run_lock_name, stage_code

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import lock_vm  # noqa: E402

_pins = lock_vm.pins  # name -> version; skips the --hash lines of a hashed lock


def test_every_lock_pins_hashes():
    """Each install requires hashes (make env, the Dockerfile, the VM's pip): each pin must carry them."""
    for path in [ROOT / "requirements.txt", ROOT / "requirements-pt.txt", *(rt.lock_path for rt in runtimes.locks())]:
        lines = path.read_text().splitlines()
        pins = [i for i, line in enumerate(lines) if "==" in line and not line.startswith((" ", "#"))]
        assert len(pins) == len(_pins(path)) > 10, path
        unhashed = [lines[i] for i in pins if not (lines[i].endswith(" \\") and "--hash=sha256:" in lines[i + 1])]
        assert not unhashed, f"{path.name}: {unhashed[:3]} have no hashes: relock (make lock / lock-pt / lock-vm)"


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


@pytest.mark.parametrize(
    "version, message",
    [
        ("tpu-vm-tf-2.15.0-pjrt", "older TensorFlow than any lock here"),
        ("tpu-vm-tf-2.21.0-pjrt", "has no VM lock in this project"),  # the Airflow side's TF: no such image
        ("v2-alpha-tpuv5-lite", "is not a TensorFlow TPU VM runtime"),
    ],
)
def test_unsupported_runtimes_are_refused_with_the_choices(version, message):
    with pytest.raises(ConfigError, match=message) as err:
        runtimes.get(version)
    assert "tpu-vm-tf-2.16.1-pjrt" in str(err.value)
    with pytest.raises(ValueError, match=message):
        PipelineConfig.model_validate({"tpu": {"runtime_version": version}})


def test_vm_lock_leaves_the_image_alone():
    """The lock never names TensorFlow or anything the image's TensorFlow brings (numpy, protobuf,
    grpcio...) at another version, except the few it may shadow, and holds what the VM runs, with the
    Airflow side's versions where they meet."""
    airflow_side = _pins(ROOT / "requirements.txt")
    for rt in runtimes.locks():
        lock, image = _pins(rt.lock_path), _pins(rt.image_path)
        assert image["tensorflow"] == rt.tensorflow
        assert set(lock) & set(image) <= runtimes.SHADOWED, "the lock replaces an image package it may not"
        image_owned = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "keras", "numpy", "protobuf", "grpcio"}
        assert not image_owned & set(lock)
        assert lock["tf-keras"].rsplit(".", 1)[0] == rt.tf_minor  # Keras 2 of the image's TF minor
        for name in ("transformers", "tokenizers", "huggingface-hub", "pydantic"):
            assert lock[name] == airflow_side[name], name
        for name in (
            "pyyaml",
            "gcsfs",
            "google-cloud-storage",
            "google-crc32c",
            "fsspec",
            "google-api-python-client",
            "oauth2client",
        ):  # the last two: TPUClusterResolver on a pod
            assert name in lock, name


@pytest.mark.slow  # resolves every image's closure with uv against the package index
def test_image_files_are_the_images_as_released():
    """An image file not captured from a real VM is exactly TensorFlow's closure as of the runtime's
    release day: no package in it is newer than the image (the 2.16.1 image: April 2024)."""
    for rt in runtimes.locks():
        if rt.image_path.read_text().startswith(lock_vm.CAPTURED):
            continue
        as_released = lock_vm.compile_lines(f"tensorflow=={rt.tensorflow}\n", rt.python, exclude_newer=rt.image_date)
        assert _pins(rt.image_path) == {lock_vm.name_of(line): line.split("==", 1)[1] for line in as_released}
    image = _pins(runtimes.get(runtimes.DEFAULT).image_path)
    assert (image["typing-extensions"], image["protobuf"], image["grpcio"]) == ("4.11.0", "4.25.3", "1.62.2")


@pytest.mark.slow  # resolves every VM lock with uv against the package index
def test_vm_lock_resolves_with_the_image_pins():
    for rt in runtimes.locks():
        resolved = {lock_vm.name_of(line): line.split("==", 1)[1] for line in lock_vm.check(rt)}
        assert resolved["tensorflow"] == rt.tensorflow
        assert {k: v for k, v in resolved.items() if k in _pins(rt.lock_path)} == _pins(rt.lock_path)
        held = {k: v for k, v in _pins(rt.image_path).items() if k not in runtimes.SHADOWED}
        assert {k: v for k, v in resolved.items() if k in held} == held  # the image as it is


def _members(root: str, sha: str) -> dict[str, bytes]:
    data = gzip.decompress(storage.read_bytes(join(root, "_code", sha, "mlm_tasks.tar.gz")))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_a_non_editable_install_stages_what_the_checkout_stages(tmp_path):
    """A wheel / Docker install has no requirements.txt beside the package: the locks are package
    data, and stage_code reads the package from wherever it is installed."""
    site = tmp_path / "site"
    subprocess.run(
        ["uv", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(ROOT)], check=True, cwd=tmp_path
    )
    installed = tmp_path / "from-install"
    staged = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, mlm_tasks.tpu.bundle as t; print(t.PACKAGE_DIR); "
            f"print(t.stage_code(sys.argv[1], {runtimes.DEFAULT!r}).sha)",
            str(installed),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert staged.returncode == 0, staged.stderr
    package_dir, sha = staged.stdout.split()
    assert package_dir == str(site / "mlm_tasks")  # really the installed copy, not this checkout

    checkout = stage_code(str(tmp_path / "from-checkout"), runtimes.DEFAULT)
    assert sha == checkout.sha
    files = _members(str(installed), sha)
    assert files == _members(str(tmp_path / "from-checkout"), checkout.sha)
    assert checkout.lock in files and "mlm_tasks/tpu/runtimes.py" in files


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
    out = subprocess.run(
        [str(python), "-c", "import ast, sys\nfor f in sys.argv[1:]: ast.parse(open(f).read(), f)", *files],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


def test_image_check_finds_what_the_image_lacks(tmp_path):
    """pip --no-deps checks nothing: check_image does, with `tensorflow` met by the image's TPU build
    whatever its distribution name."""
    from mlm_tasks.tpu.vm.check_image import unmet_requirements

    info = tmp_path / "demo_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n"
        "Requires-Dist: tensorflow<2.17,>=2.16\nRequires-Dist: numpy>=99\n"
        'Requires-Dist: pydantic\nRequires-Dist: torch; extra == "torch"\n'
        'Requires-Dist: pywin32; sys_platform == "win32"\n'
    )
    problems = unmet_requirements(str(tmp_path), "2.16.1")
    assert len(problems) == 1 and problems[0].startswith("demo-pkg 1.0 needs numpy>=99; the VM has ")
    assert any("tensorflow" in p for p in unmet_requirements(str(tmp_path), "2.21.0"))


def test_image_check_sees_what_python_imports_first(tmp_path, monkeypatch):
    """A package of the lock shadows the image's copy: the check judges the one imported (the first on
    sys.path), and holds TensorFlow's own requirements against it too."""
    from mlm_tasks.tpu.vm import check_image

    def dist(folder, name, version, requires=()):
        info = tmp_path / folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        )

    dist("deps", "shadowed-pkg", "4.16.0")
    dist("deps", "needs-new", "1.0", ["shadowed-pkg>=4.16"])
    dist("image", "shadowed-pkg", "4.11.0")
    dist("image", "tensorflow", "2.16.1", ["shadowed-pkg<4.15"])
    monkeypatch.setattr(sys, "path", [str(tmp_path / "deps"), str(tmp_path / "image")])
    assert check_image.importable()["shadowed-pkg"].version == "4.16.0"
    assert check_image.unmet_requirements(str(tmp_path / "deps"), "2.16.1") == [
        "tensorflow 2.16.1 needs shadowed-pkg<4.15; the VM has 4.16.0"
    ]


def test_a_newer_runtime_is_supported_with_its_own_lock_and_image():
    rt = runtimes.get("tpu-vm-tf-2.17.0-pjrt")
    assert (rt.tensorflow, rt.libtpu, rt.pod) == ("2.17.0", "1.11.0", False)
    assert runtimes.get("tpu-vm-tf-2.17.0-pod-pjrt").lock_path == rt.lock_path
    assert _pins(rt.lock_path)["tf-keras"].startswith("2.17.") and _pins(rt.image_path)["tensorflow"] == "2.17.0"
    with pytest.raises(ConfigError, match="split by chip family"):
        runtimes.get("tpu-vm-tf-2.18.0-pjrt-v5p-and-below")


PJRT_ONE_HOST = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true"}  # and the libtpu the probe finds (test below)


@pytest.mark.parametrize(
    "accelerator, runtime, variables",
    [
        ("v4-8", "tpu-vm-tf-2.16.1-pjrt", PJRT_ONE_HOST),
        ("v5litepod-1", "tpu-vm-tf-2.16.1-pjrt", PJRT_ONE_HOST),
        ("v5litepod-8", "tpu-vm-tf-2.17.0-pjrt", PJRT_ONE_HOST),
        ("v4-32", "tpu-vm-tf-2.16.1-pod-pjrt", {"TPU_LOAD_LIBRARY": "0", "MLM_TPU_NODE": "mlm-node"}),
        ("v5litepod-16", "tpu-vm-tf-2.17.0-pod-pjrt", {"TPU_LOAD_LIBRARY": "0", "MLM_TPU_NODE": "mlm-node"}),
    ],
)
def test_remote_line_exports_the_runtime_environment_before_tensorflow(accelerator, runtime, variables, tmp_path):
    """Google's variables for the runtime and slice shape (runtimes.ENVIRONMENT), exported before the
    first command that imports TensorFlow (the image check, the step; the bundle fetch imports none)."""
    cfg = PipelineConfig.model_validate(
        {
            "output_root": "gs://bucket/p",
            "compute": "tpu_vm",
            "tpu": {"project": "proj", "accelerator_type": accelerator, "runtime_version": runtime},
        }
    )
    bundle = stage_code(str(tmp_path), runtime)  # a local copy of what would be staged to gs://
    line = remote_command(
        cfg, "train", "r", node="mlm-node", code=type(bundle)(**{**bundle.__dict__, "uri": "gs://bucket/p/_code/x"})
    )
    exports = dict(
        shlex.split(part)[1].split("=", 1)
        for part in line.split("; ")
        if part.startswith("export ") and "PYTHONPATH" not in part
    )
    assert {k: exports.get(k) for k in variables} == variables
    others = {"TPU_LOAD_LIBRARY", "MLM_TPU_NODE", *PJRT_ONE_HOST} - set(variables)
    assert not others & set(exports), f"{others & set(exports)} exported for {accelerator}"
    assert "tensorflow" not in line.split("mlm_tasks.tpu.vm.check_image", 1)[0]  # the fetch: the image's Python alone
    first_tensorflow = min(line.index(t) for t in ("mlm_tasks.tpu.vm.check_image", "exec "))
    assert max(line.index(f"export {k}=") for k in variables) < first_tensorflow
    probe = line.find(runtimes.LIBTPU + "+set")
    assert (probe == -1) == runtimes.get(runtime).pod and probe < first_tensorflow  # one host: the libtpu probe
    assert ("--pod" in line.split("check_image", 1)[1].split(";", 1)[0]) == runtimes.get(runtime).pod


@pytest.mark.parametrize("accelerator", ["v6e-8", "v6e-16"])
def test_tensorflow_is_refused_on_v6e_with_googles_word(accelerator):
    with pytest.raises(ValueError, match="TensorFlow is not supported on v6e"):
        PipelineConfig.model_validate(
            {
                "output_root": "gs://bkt/p",
                "compute": "tpu_vm",
                "tpu": {
                    "project": "p",
                    "accelerator_type": accelerator,
                    "runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt" if accelerator == "v6e-16" else runtimes.DEFAULT,
                },
            }
        )


def test_the_remote_line_takes_the_run_lock_just_before_the_step():
    """One step per run: the lock is named by a hash (the run id never reaches a path) and taken on
    fd 9 in the shell that then execs the step, so the step holds it."""
    run_id = "manual__2025-01-01T00:00:00+00:00'; touch /tmp/pwned #"
    cfg = PipelineConfig.model_validate({"tpu": {"bootstrap": False, "workdir": "/w"}})
    setup, step = remote_command(cfg, "train", run_id, node="mlm-n").rsplit("; exec ", 1)
    lock = run_lock_name(run_id, "train")
    assert re.fullmatch(r"\.run-lock-[0-9a-f]{16}", lock)
    assert len({lock, run_lock_name(run_id, "evaluate"), run_lock_name("manual__2", "train")}) == 3
    lines = _run_lock("train", run_id)
    # With bootstrap off, last before the step.
    assert setup.endswith("; " + "; ".join(lines))
    assert lines[0].startswith(f"if ! {{ exec 9>>{lock} && flock -n 9; }}; then ")
    assert lines[1] == f"echo $$ > {lock}.pid"
    assert 'Stopping the "trainer" left by an earlier try (pid $pid)' in setup and "exit 3" in setup
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
            "after 1s.",
            f"pid {earlier.pid} still runs after 1s: SIGKILL.",
            "The earlier try stopped: starting this one.",
            "started",
        ]
        assert earlier.wait(timeout=5) == -9
    finally:
        earlier.kill()


def _probe_in_a_shell(tmp_path, package_answer: str, preset: str | None = None) -> tuple[str, str]:
    """runtimes.libtpu_probe run by sh with a stand-in python whose `libtpu` package lies at `package_answer`;
    (the exported value or "unset", stderr)."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {shlex.quote(package_answer)}\n")
    python.chmod(0o755)
    probe = "; ".join(runtimes.libtpu_probe(runtimes.get(runtimes.DEFAULT), str(python)))
    env = {"PATH": "/usr/bin:/bin"} | ({runtimes.LIBTPU: preset} if preset is not None else {})
    script = f'{probe}; echo "${{{runtimes.LIBTPU}-unset}}"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, check=True, timeout=30)
    return done.stdout.strip(), done.stderr


def test_the_remote_line_finds_the_images_libtpu(tmp_path):
    """Single-host PJRT needs TF_PLUGGABLE_DEVICE_LIBRARY_PATH to name the image's libtpu, which is not in
    one place on every image: /lib/libtpu.so, else the `libtpu` package's copy; tpu.env's value wins (the
    simulated VM's empty one: no plugin); none found is said, naming the setting."""
    assert not Path("/lib/libtpu.so").exists()  # this machine: the package's answer decides
    wheel = tmp_path / "site-packages" / "libtpu" / "libtpu.so"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    assert _probe_in_a_shell(tmp_path, str(wheel)) == (str(wheel), "")
    assert _probe_in_a_shell(tmp_path, str(wheel), preset="") == ("", "")
    assert _probe_in_a_shell(tmp_path, str(wheel), preset="/opt/libtpu.so") == ("/opt/libtpu.so", "")
    found, said = _probe_in_a_shell(tmp_path, str(tmp_path / "nowhere.so"))
    assert found == "unset" and "No libtpu.so on this VM" in said and runtimes.LIBTPU in said
    assert runtimes.libtpu_probe(runtimes.get("tpu-vm-tf-2.16.1-pod-pjrt"), "python3") == []  # the pod's runtime


def test_the_vm_fetches_the_bundle_with_the_standard_library(gcs_root, tmp_path):
    """bundle.FETCH, as the bootstrap runs it (in a Python with none of the project's packages on its path:
    -I), against the storage emulator the way the storage layer reads it."""
    import os

    from mlm_tasks import storage
    from mlm_tasks.paths import join

    uri = join(gcs_root, "_code", "x y", "mlm_tasks.tar.gz")
    storage.write_bytes(uri, b"\x1f\x8b staged bytes")
    from mlm_tasks.tpu.bundle import FETCH

    env = {"STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"], "PATH": os.environ["PATH"]}
    subprocess.run([sys.executable, "-I", "-c", FETCH, uri, "got"], cwd=tmp_path, env=env, check=True, timeout=60)
    assert (tmp_path / "got").read_bytes() == b"\x1f\x8b staged bytes"


def test_a_printed_ssh_line_pastes_into_a_shell_as_the_worker_would_run_it():
    """The smoke tool's dry run prints the remote line as an ssh command: pasted into a shell, ssh must get
    the whole line as one argument and the login placeholder must not be a redirect."""
    from mlm_tasks.tpu.bundle import ssh_command

    remote = "set -e; cd \"$HOME\"/mlm; export A='x y'; exec python3 -m mlm_tasks train --run-id 'r 1'"
    line = ssh_command(22, "/keys/my key", "mlm@<worker-0-ip>", remote)
    assert shlex.split(line) == ["ssh", "-p", "22", "-i", "/keys/my key", "mlm@<worker-0-ip>", remote]
