"""Training: learns, checkpoints, reruns are no-ops, and a SIGKILLed or preempted (SIGTERM) process resumes exactly."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import RunContext, RunPaths, join

ROOT = Path(__file__).resolve().parents[3]


def _train_cli(cfg, fingerprint, run_id, steps, *settings, **popen):
    args = [
        sys.executable,
        "-m",
        "mlm_tasks",
        "train",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--set",
        f"output_root={cfg.output_root}",
        "--set",
        f"train.steps={steps}",
        "--set",
        "train.checkpoint_every=5",
        "--set",
        "train.log_every=1",
        *(arg for setting in settings for arg in ("--set", setting)),
        "--run-id",
        run_id,
        "--data-fingerprint",
        fingerprint,
    ]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, **popen)


def _final_weights(run):
    import h5py

    out = {}
    with h5py.File(storage.local_path(run.model) + "/tf_model.h5") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if hasattr(obj, "shape") else None)
    return out


@pytest.mark.slow
def test_a_killed_or_preempted_trainer_resumes_and_matches_an_uninterrupted_run(tiny_prepared, tmp_path):
    cfg, data = tiny_prepared
    fp, steps = data["fingerprint"], 30
    # Reference: the same run, never interrupted.
    ref = _train_cli(cfg, fp, "uninterrupted", steps)
    assert ref.wait(timeout=600) == 0, ref.stdout.read()
    # Kill a second run with SIGKILL at a random step after its first checkpoint.
    kill_at = random.Random().randint(7, 24)
    proc = _train_cli(cfg, fp, "killed", steps)
    seen = 0
    for line in proc.stdout:
        if f"step {kill_at}/{steps}" in line:
            seen = kill_at
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and seen == kill_at
    run = RunPaths(cfg.output_root, "killed")
    assert not storage.exists(run.train_summary)
    retry = _train_cli(cfg, fp, "killed", steps)
    out = retry.communicate(timeout=600)[0]
    assert retry.returncode == 0, out
    summary = storage.read_json(run.train_summary)
    assert summary["steps"] == steps
    resumed = summary["resumed_from_step"]
    assert resumed % 5 == 0 and 0 <= kill_at - resumed <= 5, (kill_at, resumed)
    # The status record: the killed trainer and the retry, two starts; done at the last step.
    status = storage.read_json(run.train_status)
    assert (status["state"], status["exit_code"], status["step"], status["starts"]) == ("done", 0, steps, 2)
    assert storage.read_json(RunPaths(cfg.output_root, "uninterrupted").train_status)["starts"] == 1
    # Weights, optimizer state, schedule and data position all resumed: same final weights.
    ref_w, got_w = _final_weights(RunPaths(cfg.output_root, "uninterrupted")), _final_weights(run)
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        np.testing.assert_allclose(got_w[name], ref_w[name], rtol=1e-4, atol=1e-5, err_msg=name)

    # A preemption notice (SIGTERM, as a VM's shutdown sends) between checkpoints: the trainer saves one at
    # the step it is at and exits 75; the next trainer resumes at that step, not at the last periodic one.
    notice_at = random.Random().choice([n for n in range(7, 24) if n % 5])
    proc = _train_cli(cfg, fp, "noticed", steps)
    for line in proc.stdout:
        if f"step {notice_at}/{steps}" in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, rest
    run = RunPaths(cfg.output_root, "noticed")
    status = storage.read_json(run.train_status)
    saved = status["step"]  # the step the notice was answered at: the end of the call under way
    assert (status["state"], status["exit_code"]) == ("preempted", 75) and notice_at <= saved < steps, status
    assert f"checkpoint saved at step {saved}" in status["error"] and "Preemption notice (SIGTERM)" in rest
    retry = _train_cli(cfg, fp, "noticed", steps)
    out = retry.communicate(timeout=600)[0]
    assert retry.returncode == 0, out
    assert storage.read_json(run.train_summary)["resumed_from_step"] == saved  # no step trained twice
    got_w = _final_weights(run)
    for name in ref_w:
        np.testing.assert_allclose(got_w[name], ref_w[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_a_notice_mid_call_ends_the_call_after_its_step_and_saves_within_the_grace(tiny_prepared):
    """Issue 48: a notice while a call of train.steps_per_call steps runs ends that call after the step under
    way (the compiled loop reads the flag the notice sets between its steps), not at the call's end, and the
    save on it takes less than the grace a Spot VM gives (preemption.GRACE_S)."""
    from mlm_tasks.job.preemption import GRACE_S

    cfg, data = tiny_prepared
    per_call, steps = 100, 300
    proc = _train_cli(cfg, data["fingerprint"], "noticed-mid-call", steps, f"train.steps_per_call={per_call}")
    for line in proc.stdout:
        if f"step {per_call}/{steps}" in line:  # the first call's lines: the second call starts now
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, rest
    status = storage.read_json(RunPaths(cfg.output_root, "noticed-mid-call").train_status)
    saved = status["step"]
    assert status["state"] == "preempted" and per_call <= saved < 2 * per_call, status  # not the call's end
    waited = float(status["error"].split(f"checkpoint saved at step {saved} ")[1].split("s after")[0])
    assert waited < GRACE_S, status["error"]


@pytest.mark.slow  # trains a model, then the rerun: ~20 s: in make test, not in make test-fast
def test_train_is_a_noop_once_finished(tiny_prepared):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    first = train(cfg, RunContext.of(cfg, "noop-run", data["fingerprint"]))
    run = RunPaths(cfg.output_root, "noop-run")
    mtime = os.stat(storage.local_path(run.model) + "/tf_model.h5").st_mtime_ns
    assert train(cfg, RunContext.of(cfg, "noop-run", data["fingerprint"])) == first
    assert os.stat(storage.local_path(run.model) + "/tf_model.h5").st_mtime_ns == mtime
    history = [json.loads(x) for x in storage.read_text(run.train_history).splitlines()]
    assert history[-1]["step"] == cfg.train.steps and history[-1]["loss"] < history[0]["loss"]
    status = storage.read_json(run.train_status)  # the no-op rerun started no trainer
    assert (status["state"], status["step"], status["starts"]) == ("done", cfg.train.steps, 1)
    assert status["last_loss"] == pytest.approx(history[-1]["loss"])


def test_shards_with_another_max_length_are_refused(tiny_prepared):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    other = cfg.model_copy(update={"shards": cfg.shards.model_copy(update={"max_length": 32})})
    with pytest.raises(ConfigError, match="built with max_length 64 but this run asks for 32"):
        train(other, RunContext.of(other, "wrong-length", data["fingerprint"]))


def test_batch_larger_than_data_is_refused(tiny_prepared):
    from mlm_tasks.steps.train import train

    cfg, data = tiny_prepared
    big = cfg.model_copy(update={"train": cfg.train.model_copy(update={"batch_size": 100_000})})
    with pytest.raises(ConfigError, match="larger than the .* train records"):
        train(big, RunContext.of(big, "big-batch", data["fingerprint"]))


def test_missing_shards_say_run_build_shard_set(tiny_cfg):
    from mlm_tasks.steps.train import train

    with pytest.raises(MissingArtifactError, match="run build_shard_set first"):
        train(tiny_cfg, RunContext.of(tiny_cfg, "no-data", "0123456789abcdef"))


@pytest.mark.slow  # trains a model: in make test, not in make test-fast
def test_xla_step_inside_a_distribution_strategy_trains_on_cpu(tiny_prepared, caplog):
    """The TPU's code path (strategy.run of the XLA-compiled step, distributed dataset, mirrored
    variables) on one CPU: train.strategy=mirrored, train.xla=on."""
    from mlm_tasks.steps.train import train
    from peers.tiny_data import tiny_config

    cfg, data = tiny_prepared
    # Through load_config, as a run's settings arrive: an unknown key is an error, not a default.
    cfg = tiny_config(
        cfg.output_root,
        **{
            "train.strategy": "mirrored",
            "train.xla": "on",
            "train.device": "cpu",
            "train.steps": 6,
            "train.checkpoint_every": 3,
            "train.log_every": 1,
        },
    )
    caplog.set_level("INFO", logger="mlm_tasks")
    summary = train(cfg, RunContext.of(cfg, "xla-mirrored", data["fingerprint"]))

    assert "Training on cpu (MirroredStrategy): 1 replica(s)" in caplog.text
    assert summary["xla"] is True and summary["steps"] == 6
    # MFU against this CPU's peak in any precision (mlm_tasks/model/cpu_peak.py), not the kernel in use.
    assert summary["mfu"] is None or 0 < summary["mfu"] < 1, summary["mfu_of"]
    assert "peak" in summary["mfu_of"] and "matmul probe" not in summary["mfu_of"], summary["mfu_of"]
    run = RunPaths(cfg.output_root, "xla-mirrored")
    losses = [json.loads(x)["loss"] for x in storage.read_text(run.train_history).splitlines()]
    assert len(losses) == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert storage.exists(join(run.checkpoints, "ckpt-6.index")) and storage.exists(run.train_summary)
