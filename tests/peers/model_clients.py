"""The clients of our saved model, and a model for them to load.

    pt_python     session   python of the PyTorch + transformers 5.x env (`make env-pt`, .venv-pt/)
    tiny_model    session   (cfg, RunPaths) of a model trained by the real train step, saved by its real save
    tiny_modernbert session the same for model.architecture=modernbert, trained XLA-compiled in bf16
    run_in(python, code_or_script, *args)   a subprocess in that env: no network, no TF_USE_LEGACY_KERAS
                                            unless asked, returns CompletedProcess (stdout, stderr text)

The PyTorch env is what a Hub user has: torch and the current transformers, no TensorFlow. It is
created once by `make env-pt` (uv, pinned by requirements-pt.txt) and reused while that file is unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PT_VENV = ROOT / ".venv-pt"
TRAIN_STEPS = 40  # enough that fill-mask probabilities are not a near-tie over the whole vocabulary


@pytest.fixture(scope="session")
def pt_python() -> str:
    # make is a no-op when .venv-pt/.installed is newer than requirements-pt.txt.
    done = subprocess.run(
        ["make", "-s", "env-pt", f"VENV_PT={PT_VENV}"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"`make env-pt` failed:\n{done.stdout}\n{done.stderr}"
    python = PT_VENV / "bin" / "python"
    assert python.exists(), f"{python} missing after make env-pt"
    return str(python)


@pytest.fixture(scope="session")
def tiny_model(tiny_prepared):
    from mlm_tasks.paths import RunContext, RunPaths
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": TRAIN_STEPS})})
    train(cfg, RunContext.of(cfg, "clients-run", data["fingerprint"]))
    return cfg, RunPaths(cfg.output_root, "clients-run")


# ModernBERT's proportions on the tiny config, and a window (±8 tokens) shorter than its 64-token sequences.
MODERNBERT = {"model.architecture": "modernbert", "model.intermediate_size": 96, "model.local_attention": 16}


@pytest.fixture(scope="session")
def tiny_modernbert(tiny_prepared):
    from mlm_tasks.paths import RunContext, RunPaths
    from mlm_tasks.steps.train import train
    from peers.tiny_data import tiny_config

    data_cfg, data = tiny_prepared
    train_over = {"train.steps": TRAIN_STEPS, "train.xla": "on", "train.mixed_precision": "bf16"}
    cfg = tiny_config(data_cfg.output_root, **MODERNBERT, **train_over, **{"train.steps_per_call": 4})
    summary = train(cfg, RunContext.of(cfg, "clients-modernbert", data["fingerprint"]))
    return cfg, RunPaths(cfg.output_root, "clients-modernbert"), summary


def client_env(legacy_keras: bool = False) -> dict:
    """The environment of a user's fresh shell: offline (loopback only), and without the project's
    TF_USE_LEGACY_KERAS unless the caller says the client sets it too."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def run_in(
    python: str | None, code: str, *args: str, timeout: int = 600, cwd: str | None = None, **env_opts
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python or sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=client_env(**env_opts),
    )
