"""bench/bench_train.py's runs are valid configurations of today's default: the bench broke silently when
configs/default.yaml moved to 30% masking (more than its 32 LM-head positions), which no test ran."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

import bench_train  # noqa: E402

from mlm_tasks.config import load_config  # noqa: E402

DEFAULT = os.path.join(REPO, "configs", "default.yaml")  # what the bench runs on, whatever MLM_BENCH_CONFIG says


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_every_bench_run_is_a_valid_config_with_the_references_masking(preset):
    for xla in ("off", "on"):
        for precision in ("off", "bf16"):
            cfg = load_config(
                DEFAULT, {"output_root": "/tmp/unused", **bench_train.overrides(preset, xla, 60, precision=precision)}
            )
            assert cfg.train.mlm_probability == 0.15 and cfg.train.max_predictions_per_seq == 32
            assert (cfg.model.preset, cfg.train.xla, cfg.train.mixed_precision) == (preset, xla, precision)
