"""Checkpoint sync to the Hugging Face Hub during training (`publish.sync_checkpoints`), never blocking it
(docs/releases.md#checkpoints-on-the-hub-during-training).

    sync = hub_checkpoint_sync(cfg, hub_token, train_records=..., global_batch=..., total_steps=...)  # None: off
    sync(step, path)   # train: after each epoch's checkpoint and the last; sync.save_model adds the model folder
    sync.finish()      # waits for the uploads; a failure is logged, never raised
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import AuthError, ConfigError, MissingArtifactError, NoRetryError, TransientError
from mlm_tasks.hub.api import DEFAULT_TIMEOUT_S, hub_api, hub_errors, scrub
from mlm_tasks.paths import join

log = logging.getLogger(__name__)


def check_sync_settings(cfg: PipelineConfig, token: str | None) -> tuple[str, str] | None:
    """With publish.sync_checkpoints on, fail before any work if the repo or the token is missing;
    (repo id, token) then, None with sync off."""
    if not cfg.publish.sync_checkpoints:
        return None
    if not cfg.publish.repo_id:
        raise ConfigError("publish.sync_checkpoints needs publish.repo_id, the Hub repo the checkpoints go to.")
    if not token:
        raise AuthError(
            "publish.sync_checkpoints is on but train() got no Hub token (hub_token): give it a "
            "Hub write token — the CLI reads it from HF_TOKEN, the Airflow train task from the "
            f"password of connection {cfg.publish.hf_conn_id!r} — or turn "
            "publish.sync_checkpoints off."
        )
    return cfg.publish.repo_id, token


def hub_checkpoint_sync(
    cfg: PipelineConfig,
    token: str | None,
    *,
    train_records: int,
    global_batch: int,
    total_steps: int,
    strategy=None,
    endpoint: str | None = None,
) -> HubCheckpointSync | None:
    """The Hub sync hook for this training run, or None when sync is off or this is not worker 0."""
    target = check_sync_settings(cfg, token)
    if target is None:
        return None
    repo_id, token = target
    task_id = getattr(getattr(strategy, "cluster_resolver", None), "task_id", 0) or 0
    if task_id != 0:  # multi-worker strategies: one upload is enough
        log.info("Checkpoint sync runs on worker 0 only (this is worker %s)", task_id)
        return None
    steps_per_epoch = max(1, train_records // global_batch)
    publish = cfg.publish
    syncer = CheckpointSyncer(
        repo_id, token, endpoint, publish.private, conn_id=publish.hf_conn_id, timeout_s=publish.request_timeout_s
    )
    log.info(
        "Syncing checkpoints to %s every %d steps (each epoch) and at the end of training", repo_id, steps_per_epoch
    )
    return HubCheckpointSync(syncer, steps_per_epoch, total_steps)


class HubCheckpointSync:
    """An `on_checkpoint(step, path)` hook: queue epoch-end checkpoints and the final one for upload."""

    def __init__(self, syncer: CheckpointSyncer, steps_per_epoch: int, final_step: int):
        self.syncer, self.final_step = syncer, final_step
        self.checkpoint_every = steps_per_epoch  # asks train for a checkpoint at every epoch end
        self.save_model: Callable[[str], None] | None = None  # writes the model folder into a local folder

    def __call__(self, step: int, path: str) -> None:
        if step % self.checkpoint_every and step != self.final_step:
            return  # a checkpoint of train's own cadence, not an epoch end
        staged, model = stage_checkpoint(path), None
        try:
            if self.save_model is not None:  # here, in the training thread: the weights as of this step
                model = tempfile.mkdtemp(prefix="mlm-model-stage-")
                self.save_model(model)
            self.syncer.submit(staged, step, model)  # snapshots the checkpoint; the model folder is its to delete
            model = None
        finally:
            shutil.rmtree(staged, ignore_errors=True)
            if model is not None:
                shutil.rmtree(model, ignore_errors=True)

    def finish(self, timeout: float | None = 3600) -> list[dict]:
        """Wait for the queued uploads; failures are logged, not raised."""
        try:
            uploaded = self.syncer.close(timeout)
        except (NoRetryError, TransientError) as err:  # what close() raises
            log.warning(
                "Checkpoint sync to the Hub failed (training is complete; checkpoints are in output_root): %s", err
            )
            return list(self.syncer.uploaded)
        steps = [u["step"] for u in uploaded]
        log.info("Synced %d checkpoint(s) to %s (steps %s)", len(uploaded), self.syncer.repo_id, steps)
        return uploaded


def stage_checkpoint(checkpoint_path: str) -> str:
    """A local temp folder holding only `checkpoint_path`'s files (e.g. .../ckpt-40.index and .data-*)
    and a `checkpoint` state file naming it, so `tf.train.latest_checkpoint` finds it after a download."""
    folder, prefix = checkpoint_path.rsplit("/", 1)
    staged = tempfile.mkdtemp(prefix="mlm-ckpt-stage-")
    t0 = time.time()
    names = [uri.rsplit("/", 1)[1] for uri in storage.listdir(folder)]
    names = [n for n in names if n.startswith(prefix + ".") and ".tmp-" not in n]
    if not names:
        raise MissingArtifactError(f"No files of checkpoint {checkpoint_path}: it was not saved, or was deleted.")
    for name in names:
        target = os.path.join(staged, name)
        if storage.is_local(folder):
            _freeze(os.path.join(storage.local_path(folder), name), target)
        else:
            storage.copy_to_local(join(folder, name), target)  # training waits for this download, not the upload
    with open(os.path.join(staged, "checkpoint"), "w", encoding="utf-8") as f:
        f.write(f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
    if not storage.is_local(folder):
        log.info("Downloaded checkpoint %s for the Hub sync in %.1fs", checkpoint_path, time.time() - t0)
    return staged


@dataclass
class _Job:
    step: int
    snapshot: str  # temp folder with the submitted folder's files frozen at submit time
    model: str | None = None  # a local model folder of this step (the job's to delete), pushed as branch step-N


class CheckpointSyncer:
    """Uploads local checkpoint folders to `<repo_id>/checkpoints/` from a background thread (`submit` returns
    at once), each an exact copy of one checkpoint. A waiting checkpoint is dropped for a newer one
    (`skipped_steps`); `close()` raises an error of the last failed upload's kind (TransientError for an
    unforeseen one)."""

    def __init__(
        self,
        repo_id: str,
        token: str,
        endpoint: str | None = None,
        private: bool = True,
        conn_id: str = "huggingface_default",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        # Resolve the client now so a missing token fails at the start of training, not at its end.
        self._api, self._url = hub_api(token, endpoint, conn_id, timeout_s)
        self.repo_id, self.private = repo_id, private
        self._token, self._conn_id = token, conn_id
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._closing = False
        self._repo_ready = False
        self.errors: list[str] = []
        self._last_kind: type[Exception] = TransientError  # of the last failed upload
        self.uploaded: list[dict] = []  # {"step", "commit_oid", "commit_url"} per finished upload
        self.skipped_steps: list[int] = []
        self._thread = threading.Thread(target=self._run, name="hub-checkpoint-sync", daemon=True)
        self._thread.start()

    def submit(self, local_dir: str, step: int, model_dir: str | None = None) -> None:
        """Queue `local_dir` (the checkpoint of `step`) for upload and return at once; `model_dir`, a local
        model folder of that step that the syncer then owns (deletes), goes to the branch `step-N`."""
        if self._closing:
            raise RuntimeError("CheckpointSyncer.submit after close(): create a new syncer.")
        snapshot = _snapshot(local_dir)
        with self._cond:
            if self._pending is not None:
                log.info("Checkpoint upload is behind: skipping step %d for step %d", self._pending.step, step)
                self.skipped_steps.append(self._pending.step)
                _cleanup(self._pending)
            self._pending = _Job(step, snapshot, model_dir)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> list[dict]:
        """Wait for the queued upload to finish; raise (see the class) if any upload failed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TransientError(
                f"A checkpoint upload to {self.repo_id} is still running after {timeout}s: the "
                "Hub or the network is slow. Training results are safe in output_root; retry "
                "the upload later or raise the timeout."
            )
        if self.errors:
            kind = self._last_kind if issubclass(self._last_kind, (NoRetryError, TransientError)) else TransientError
            raise kind(f"{len(self.errors)} checkpoint upload(s) to {self.repo_id} failed; the last: {self.errors[-1]}")
        return list(self.uploaded)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                if self._pending is None:
                    return
                job, self._pending = self._pending, None
            try:
                self._upload(job)
            except Exception as err:  # recorded for close(): a background failure, whatever it is
                message = scrub(str(err), self._token)
                self._last_kind = type(err)
                log.warning(
                    "Checkpoint upload of step %d to %s failed (training goes on): %s", job.step, self.repo_id, message
                )
                self.errors.append(message)
            finally:
                _cleanup(job)

    def _upload(self, job: _Job) -> None:
        action = f"uploading the step {job.step} checkpoint to {self.repo_id}"
        with hub_errors(action, self._token, self._url, self._conn_id):
            if not self._repo_ready:
                self._api.create_repo(self.repo_id, private=self.private, exist_ok=True)
                self._repo_ready = True
            info = self._api.upload_folder(
                repo_id=self.repo_id,
                folder_path=job.snapshot,
                path_in_repo="checkpoints",
                delete_patterns="*",
                ignore_patterns=["*.tmp-*", "**/*.tmp-*"],
                commit_message=f"Training checkpoint at step {job.step}",
            )
            done = {"step": job.step, "commit_oid": info.oid, "commit_url": info.commit_url}
            if job.model is not None:
                # A retried step finds its branch (exist_ok) and commits the model onto it again.
                branch = f"step-{job.step}"
                self._api.create_branch(self.repo_id, branch=branch, revision=info.oid, exist_ok=True)
                model = self._api.upload_folder(
                    repo_id=self.repo_id,
                    folder_path=job.model,
                    revision=branch,
                    commit_message=f"Model at step {job.step}",
                )
                done.update(revision=branch, revision_oid=model.oid)
        self.uploaded.append(done)
        log.info("Uploaded the step %d checkpoint to %s (%s)", job.step, self.repo_id, done)


# Small files (the `checkpoint` state file) may be rewritten in place by the next save: copied. Big ones get
# fresh names per save: a hard link freezes them for free.
COPY_BELOW_BYTES = 1 << 20


def _snapshot(local_dir: str) -> str:
    """Freeze the checkpoint's files as they are now, so training may write the next one meanwhile."""
    src = storage.local_path(local_dir)
    if not os.path.isdir(src):
        raise MissingArtifactError(
            f"Checkpoint folder {local_dir} does not exist: submit the folder the checkpoint was just written to."
        )
    dest = tempfile.mkdtemp(prefix="mlm-ckpt-snapshot-")
    return shutil.copytree(
        src, dest, copy_function=_freeze, ignore=shutil.ignore_patterns("*.tmp-*"), dirs_exist_ok=True
    )


def _freeze(source: str, target: str) -> None:
    if os.path.getsize(source) >= COPY_BELOW_BYTES:
        with contextlib.suppress(OSError):  # another filesystem, or links not supported: copied
            os.link(source, target)
            return
    shutil.copy2(source, target)


def _cleanup(job: _Job) -> None:
    for folder in (job.snapshot, job.model):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
