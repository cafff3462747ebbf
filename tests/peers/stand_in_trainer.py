"""A stand-in for `python -m mlm_tasks train` on a simulated TPU VM: the real status record around a loop
of sleeps, so that a test can kill, freeze, reattach to and stop a trainer in seconds.

    python = write_stand_in(tmp_path, step_s=0.25)                        # tpu.python of the run
    python = write_stand_in(tmp_path, step_s=0.25, model_from=reference)  # + a model for evaluate
    python = write_stand_in(tmp_path, step_s=0.15, bad_input_at_step=4)   # exits 2 at step 4
    steps = steps_made(workdir, run_id)   # [(pid, step), ...] of every step the run's stand-ins made, in order

The stand-in writes runs/<run>/train/status.json (mlm_tasks/job/status.py) as the real trainer does,
records each step it makes with its pid in `<tpu.workdir>/steps-<run>.log`, takes the seconds a step
from `<tpu.workdir>/pace-<run>` while that file exists (`set_pace`), "checkpoints" every
checkpoint_every steps (train/ckpt.json) and resumes from there. With `model_from` (a RunPaths of a
run the real train step made on the same data) it ends as the real trainer does: the model in
runs/<run>/model/, its own loss curve in history.jsonl, summary.json last, so that evaluate,
fill_mask and report run on a real model. `bad_input_at_step` makes it exit 2 there (no retry can fix it);
a file `fail-<run>` in the workdir makes it fail at its next step as the TPU runtime does when its host
goes down (exit 1, recorded "failed").
The wrapper refuses any other command than `-m mlm_tasks train` (exit 9).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRAINER = """import json, os, sys, tempfile, time
sys.path.insert(0, {root!r})
from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import NoRetryError
from mlm_tasks.job.status import StatusRecord
from mlm_tasks.paths import RunPaths, join
args = sys.argv[1:]
cfg = PipelineConfig.model_validate_json(args[args.index("--config-json") + 1])
run = RunPaths(cfg.output_root, args[args.index("--run-id") + 1])
ckpt = join(run.root, "train", "ckpt.json")
start = storage.read_json(ckpt)["step"] if storage.exists(ckpt) else 0
total = cfg.train.steps
model_from = {model_from!r}
bad_input_at_step = {bad_input_at_step!r}
print("stand-in trainer from step", start, flush=True)
pace = "pace-%s" % os.path.basename(run.root)  # a test slows the trainer down by writing seconds a step here
with StatusRecord(run, total_steps=total, start_step=start, heartbeat_s=cfg.train.heartbeat_s) as status:
    for step in range(start + 1, total + 1):
        time.sleep(float(open(pace).read()) if os.path.exists(pace) else {step_s})
        if os.path.exists("fail-%s" % os.path.basename(run.root)):  # a test's: the runtime dies under it
            os.remove("fail-%s" % os.path.basename(run.root))
            raise RuntimeError("TPU runtime: the host is going down")
        if bad_input_at_step == step:
            print("error: the shards are not what this run was planned on", flush=True)
            raise NoRetryError("bad input at step %d" % step)
        with open("steps-%s.log" % os.path.basename(run.root), "a") as f:
            f.write("%d %d\\n" % (os.getpid(), step))
        status.progress(step, 10.0 / step, 1000.0, (total - step) * {step_s})
        if step % cfg.train.checkpoint_every == 0:
            storage.write_json(ckpt, {{"step": step}})
    if model_from:  # end as the real trainer does: model, history, then summary.json (training complete)
        reference = RunPaths(cfg.output_root, model_from)
        with tempfile.TemporaryDirectory() as tmp:  # local folder or gs://, as the real trainer writes
            storage.upload_dir(storage.download_dir(reference.model, tmp), run.model)
        history = [{{"step": s, "loss": 10.0 / s, "learning_rate": 1e-3}} for s in range(1, total + 1)]
        storage.write_text(run.train_history, "".join(json.dumps(h) + "\\n" for h in history))
        summary = {{**storage.read_json(reference.train_summary), "steps": total, "resumed_from_step": start,
                   "first_loss": 10.0, "last_loss": 10.0 / total}}
        storage.write_json(run.train_summary, summary)
print("stand-in trainer done at step", total, flush=True)
"""


def write_stand_in(
    folder: Path, step_s: float, model_from: str | None = None, bad_input_at_step: int | None = None
) -> Path:
    """The VM's `python` (a wrapper script in `folder`) that runs the stand-in trainer, and the real CLI for the
    other steps (the model is judged on the VM); `model_from`:
    the run id, under the same output_root, whose model the stand-in hands on at its end;
    `bad_input_at_step`: the step at which it fails as a trainer given bad input does (exit 2)."""
    stub = folder / "stand_in_trainer.py"
    stub.write_text(
        TRAINER.format(root=str(ROOT), step_s=step_s, model_from=model_from, bad_input_at_step=bad_input_at_step)
    )
    python = folder / "python"
    python.write_text(
        # train is the stand-in; the steps that judge the model on the VM (evaluate, downstream, fill_mask) are real
        f'#!/bin/sh\n[ "$1 $2" = "-m mlm_tasks" ] || exit 9\n[ "$3" = train ] || exec {sys.executable} "$@"\n'
        f'shift 3\nexec {sys.executable} {stub} "$@"\n'
    )
    python.chmod(0o755)
    return python


def set_pace(workdir: Path, run_id: str, step_s: float | None) -> None:
    """Slow the run's stand-in down to `step_s` a step from its next step on (None: its own pace again), so
    that a window a test must see open (a trainer running on while a service restarts) stays open however
    slowly a loaded machine restarts that service."""
    from mlm_tasks.paths import safe_run_id

    path = workdir / f"pace-{safe_run_id(run_id)}"
    if step_s is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(str(step_s))


def steps_made(workdir: Path, run_id: str) -> list[tuple[int, int]]:
    """(pid, step) of each step the stand-in trainers of run `run_id` made in `workdir` (tpu.workdir), in order."""
    from mlm_tasks.paths import safe_run_id

    path = workdir / f"steps-{safe_run_id(run_id)}.log"
    return (
        [(int(p), int(s)) for p, s in (line.split() for line in path.read_text().splitlines())] if path.exists() else []
    )
