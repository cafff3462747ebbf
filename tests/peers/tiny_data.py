"""Fixtures for the tiny preset: real Wikipedia text (12 articles of the embedded sample), prepared once.

tiny_cfg(tmp_path)        function  configs/tiny.yaml with output_root in a fresh temp folder
tiny_prepared             session   (cfg, data summary) of a prepared tiny dataset, shared read-only
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlm_tasks.config import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "tiny.yaml"


def tiny_config(output_root, **overrides):
    return load_config(TINY_YAML, {"output_root": str(output_root), **overrides})


@pytest.fixture
def tiny_cfg(tmp_path):
    return tiny_config(tmp_path / "out")


@pytest.fixture(scope="session")
def tiny_prepared(tmp_path_factory):
    from mlm_tasks.steps import build_shard_set

    cfg = tiny_config(tmp_path_factory.mktemp("tiny") / "out")
    return cfg, build_shard_set(cfg)
