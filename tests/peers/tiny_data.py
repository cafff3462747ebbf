"""Fixtures for the tiny preset: real Wikipedia text (12 articles of the embedded sample), prepared once.

tiny_cfg(tmp_path)        function  configs/tiny.yaml with output_root in a fresh temp folder
tiny_prepared             session   (cfg, data summary) of a prepared tiny dataset, shared read-only

The dataset is built once per test run, not once per pytest-xdist worker (~8 s alone, ~20 s on a loaded
machine): the first worker builds it under a lock, and each worker gets its own copy, so nothing one
worker writes beside it reaches another.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from mlm_tasks.config import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "tiny.yaml"
# The trigger form's fields for a tiny run of mlm_pretrain. Each field overrides the config file, and the form shows
# the embedded run's values (ModernBERT, 128 tokens), so a tiny run passes every one of them.
TINY_FORM = {
    "config_file": str(TINY_YAML),
    "architecture": "roberta",
    "vocab_size": 1000,
    "max_length": 64,
    "steps": 12,
    "batch_size": 8,
}


def tiny_config(output_root, **overrides):
    return load_config(TINY_YAML, {"output_root": str(output_root), **overrides})


@pytest.fixture
def tiny_cfg(tmp_path):
    return tiny_config(tmp_path / "out")


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory):
    from mlm_tasks.steps import build_shard_set

    base = tmp_path_factory.getbasetemp()
    # Under xdist every worker's basetemp is a folder of the run's own one (popen-gwN).
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-shared"
    shared.mkdir(exist_ok=True)
    built, summary = shared / "out", shared / "data.json"
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not summary.exists():  # a worker that died mid-build left no summary: build again from scratch
            shutil.rmtree(built, ignore_errors=True)
            summary.write_text(json.dumps(build_shard_set(tiny_config(built))))
    mine = tmp_path_factory.mktemp("tiny") / "out"
    shutil.copytree(built, mine)
    # The summary names its folders: point them at this worker's copy (the files name none).
    data = json.loads(summary.read_text().replace(json.dumps(str(built))[1:-1], json.dumps(str(mine))[1:-1]))
    return tiny_config(mine), data
