"""The TPU VM's shell line run under bash on this machine: hostile run values stay data (and a run
cannot set a hostile URI in the first place), the staged code is unpacked only with the hash the line
carries, and only the step sees the Hub token.

    python -m pytest tests/mlm_tasks/tpu/test_bundle_shell.py -q

A stand-in `python` (tpu.python) plays the image's interpreter: pip, the image check and the step
record their argv and environment in the workdir instead of installing or training; the rest of the
line (lock, fetch, unpack) is the real one. The injected command is `mlm-pwned`, a program on PATH
that leaves a marker file: if it ever ran, a value reached the shell as code.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mlm_tasks.config import PipelineConfig, build_config
from mlm_tasks.errors import ConfigError
from mlm_tasks.tpu import runtimes
from mlm_tasks.tpu.bundle import remote_command, stage_code

INJECTIONS = [
    "a'; mlm-pwned; echo '",
    'a"; mlm-pwned; echo "',
    "$(mlm-pwned)",
    "`mlm-pwned`",
    "a\nmlm-pwned\n",
    "a; mlm-pwned #",
    "'\"$(mlm-pwned)\"'`mlm-pwned`",
]

STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
kind = {{"pip": "pip", "mlm_tasks.tpu.vm.check_image": "check", "mlm_tasks": "step"}}.get(
    args[1] if args[:1] == ["-m"] else "")
if kind is None:
    sys.exit(9)
stdin = sys.stdin.readline() if "--hub-token-stdin" in args else None
with open("calls.jsonl", "a") as f:  # the current directory: the workdir
    f.write(json.dumps({{"kind": kind, "argv": args, "env": dict(os.environ), "stdin": stdin}}) + "\\n")
if kind == "pip":
    os.makedirs(args[args.index("--target") + 1])
"""


class VM:
    """This machine as a TPU VM: a workdir, a stand-in python, PATH with the marker program."""

    def __init__(self, tmp_path: Path, hostile: str = ""):
        self.tmp = tmp_path
        self.marker = tmp_path / "PWNED"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        pwned = bin_dir / "mlm-pwned"
        pwned.write_text(f"#!/bin/sh\ntouch {self.marker}\n")
        pwned.chmod(0o755)
        self.path = f"{bin_dir}:/usr/bin:/bin"
        self.python = tmp_path / f"py{hostile}" / "python"
        self.python.parent.mkdir()
        self.python.write_text(STUB.format(python=sys.executable))
        self.python.chmod(0o755)
        self.workdir = tmp_path / f"vm{hostile}" / "mlm"
        (tmp_path / "home").mkdir()

    def cfg(self, output_root: str = "out", **tpu) -> PipelineConfig:
        cfg = PipelineConfig.model_validate({"tpu": {"workdir": str(self.workdir), "python": str(self.python), **tpu}})
        return cfg.model_copy(update={"output_root": output_root})  # no validation: the quoting layer alone

    def run(self, line: str, token: str | None = None) -> subprocess.CompletedProcess:
        """The line under bash; `token`: what the session answers the token prompt with, on stdin."""
        env = {"PATH": self.path, "HOME": str(self.tmp / "home")}
        return subprocess.run(
            ["bash", "-c", line],
            env=env,
            cwd=self.tmp / "home",
            capture_output=True,
            text=True,
            timeout=60,
            input=f"{token}\n" if token else "",
        )

    def calls(self, kind: str) -> list[dict]:
        path = self.workdir / "calls.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [c for c in map(json.loads, lines) if c["kind"] == kind]


def _tree(root: Path) -> set[Path]:
    return {Path(d, n).relative_to(root) for d, dirs, files in os.walk(root) for n in dirs + files}


def _outside(new: set[Path], workdir: Path) -> set[Path]:
    """What was made neither in the workdir nor as one of its folders (mkdir -p)."""
    return {p for p in new if p != workdir and workdir not in p.parents and p not in workdir.parents}


@pytest.mark.parametrize("hostile", INJECTIONS)
def test_hostile_values_stay_data_on_the_vm(tmp_path, hostile):
    vm = VM(tmp_path, hostile)
    root = str(tmp_path / f"root{hostile}")
    bundle = stage_code(root, runtimes.DEFAULT)
    cfg = vm.cfg(root, env={"HOSTILE": hostile})
    extra = ["--note", hostile, f"../../{hostile}"]
    before = _tree(tmp_path)
    done = vm.run(remote_command(cfg, "train", hostile, node="mlm-n", code=bundle, extra_args=extra))
    assert done.returncode == 0, done.stderr
    assert not vm.marker.exists(), "a value ran as a command"
    [step] = vm.calls("step")
    assert step["argv"][:4] == ["-m", "mlm_tasks", "train", "--config-json"]
    assert json.loads(step["argv"][4])["output_root"] == root
    assert step["argv"][5:] == ["--run-id", hostile, *extra] and step["env"]["HOSTILE"] == hostile
    assert _outside(_tree(tmp_path) - before, vm.workdir.relative_to(tmp_path)) == set()


@pytest.mark.parametrize("hostile", INJECTIONS)
def test_a_failed_fetch_names_a_hostile_uri_without_running_it(tmp_path, hostile):
    """The error message of a failed fetch quotes the bundle's URI too (once echoed inside single quotes)."""
    vm = VM(tmp_path)
    root = tmp_path / f"root{hostile}"
    bundle = stage_code(str(root), runtimes.DEFAULT)
    (root / "_code" / bundle.sha / "mlm_tasks.tar.gz").unlink()
    done = vm.run(remote_command(vm.cfg(str(root)), "train", "r", node="mlm-n", code=bundle))
    assert done.returncode == 3 and not vm.marker.exists()
    assert f"Fetching the staged code from {bundle.uri} failed" in done.stderr


HOSTILE_URIS = [
    "gs://bucket/x'; touch /tmp/pwned; echo '",
    'gs://bucket/x"$(id)"',
    "gs://bucket/`id`",
    "out\nrm -rf ~",
    "out; id",
    "out/a b",
    "gs://bucket/p/../other",
    "../up",
]
RUN_URIS = [
    "output_root",
    "corpus.hf_path",
    "corpus.local_paths",
    "corpus.dump_path",
    "corpus.shards_uri",
    "corpus.tokenizer_uri",
    "model.init_from",
    "model.init_revision",
    "publish.repo_id",
    "publish.tokenizer_repo_id",
]


@pytest.mark.parametrize("setting", RUN_URIS)
@pytest.mark.parametrize("value", HOSTILE_URIS)
def test_a_run_cannot_set_a_hostile_uri(setting, value):
    with pytest.raises(ConfigError) as err:
        build_config(overrides={setting: [value] if setting == "corpus.local_paths" else value})
    allowed = "[A-Za-z0-9._/*?-]" if setting == "corpus.local_paths" else "[A-Za-z0-9._/-]"
    expected = "'..' path segment" if ".." in value else f"allowed set {allowed}"
    assert setting in str(err.value) and expected in str(err.value)


def test_plain_uris_pass():
    cfg = build_config(
        overrides={
            "output_root": "gs://my-bucket/mlm/run_1",
            "corpus.local_paths": ["/data/x/*.txt"],
            "corpus.tokenizer_uri": "org/tok-1.0",
            "publish.repo_id": "my-org/roberta-wiki-mlm",
            "corpus.dump_path": "file:///data/enwiki.xml.bz2",
        }
    )
    assert cfg.output_root == "gs://my-bucket/mlm/run_1"


def _tamper(tarball: Path) -> None:
    """Replace a bundle's tarball by another valid one, as someone with write access to the bucket could."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("mlm_tasks/EVIL")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    tarball.write_bytes(gzip.compress(raw.getvalue()))


def test_a_tampered_bundle_is_refused_before_unpacking(tmp_path):
    vm = VM(tmp_path)
    bundle = stage_code(str(tmp_path / "out"), runtimes.DEFAULT)
    staged = tmp_path / "out" / "_code" / bundle.sha / "mlm_tasks.tar.gz"
    _tamper(staged)
    got = hashlib.sha256(staged.read_bytes()).hexdigest()
    done = vm.run(remote_command(vm.cfg(), "train", "r", node="mlm-n", code=bundle))
    assert done.returncode == 3, done.stderr
    assert f"has sha256 {got}, not {bundle.tar_sha256} (hash mismatch" in done.stderr
    assert "Fetching the staged code" not in done.stderr  # the mismatch, not a failed fetch, is reported
    assert not (vm.workdir / "code").exists() and not (vm.workdir / f".installed-{bundle.sha}").exists()
    assert not vm.calls("pip") and not vm.calls("step")


def test_the_installed_marker_is_not_trusted_and_stage_code_repairs_the_bundle(tmp_path):
    vm = VM(tmp_path)
    root = str(tmp_path / "out")
    bundle = stage_code(root, runtimes.DEFAULT)
    line = remote_command(vm.cfg(), "train", "r", node="mlm-n", code=bundle)
    assert vm.run(line).returncode == 0 and (vm.workdir / f".installed-{bundle.sha}").exists()
    # The copy kept beside code/ and the bucket's both changed: the marker alone lets nothing through.
    staged = tmp_path / "out" / "_code" / bundle.sha / "mlm_tasks.tar.gz"
    _tamper(vm.workdir / "mlm_tasks.tar.gz")
    _tamper(staged)
    again = vm.run(line)
    assert again.returncode == 3 and "hash mismatch" in again.stderr
    assert len(vm.calls("step")) == 1 and not (vm.workdir / "code" / "mlm_tasks" / "EVIL").exists()
    # The next try stages again: the marker is there, the bytes are not ours, so they are uploaded anew.
    assert stage_code(root, runtimes.DEFAULT) == bundle
    assert hashlib.sha256(staged.read_bytes()).hexdigest() == bundle.tar_sha256
    fixed = vm.run(line)
    assert fixed.returncode == 0, fixed.stderr
    assert f"Installing project {bundle.sha}" in fixed.stdout and len(vm.calls("step")) == 2


def test_only_the_step_sees_the_hub_token(tmp_path):
    """On stdin, after the prompt, and only to the step: no environment (the bootstrap's or the step's) holds it."""
    vm = VM(tmp_path)
    bundle = stage_code(str(tmp_path / "out"), runtimes.DEFAULT)
    line = remote_command(vm.cfg(), "train", "r", node="mlm-n", code=bundle, expect_token=True)
    done = vm.run(line, token="hf_secret_value")
    assert done.returncode == 0, done.stderr
    [pip], [check], [step] = vm.calls("pip"), vm.calls("check"), vm.calls("step")
    for bootstrap in (pip, check):
        assert "hf_secret_value" not in json.dumps(bootstrap)
    assert step["stdin"] == "hf_secret_value\n" and step["argv"][-1] == "--hub-token-stdin"
    assert "hf_secret_value" not in json.dumps(step["env"]) + json.dumps(step["argv"])
    assert "hf_secret_value" not in line + done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "MLM_SEND_HUB_TOKEN"
    missing = vm.run(line)  # the session sent an empty line: no token
    assert missing.returncode == 3 and "The Hub token did not reach the VM" in missing.stderr
