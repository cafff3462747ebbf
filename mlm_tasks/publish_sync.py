"""Push training checkpoints to the Hugging Face Hub from a background thread, never blocking training.

    sync = CheckpointSyncer(cfg.publish.repo_id, token, private=cfg.publish.private)
    ...at each epoch end:  sync.submit(checkpoint_dir, step)     # returns at once
    sync.close(timeout=600)                                      # waits; raises if any upload failed

Each upload makes the repo's `checkpoints/` folder an exact copy of one checkpoint (files of older
checkpoints are deleted in the same commit); the repo's commit history keeps every uploaded one.
If uploads fall behind training, only the newest waiting checkpoint is kept: an older one that never
started uploading is dropped (logged, and listed in `skipped_steps`).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass

from mlm_tasks import storage
from mlm_tasks.hub import PublishError, hub_api, hub_errors, scrub

log = logging.getLogger(__name__)


@dataclass
class _Job:
    step: int
    source: str              # the folder as submitted (local path or gs://)
    snapshot: str | None     # temp folder with the files frozen at submit time (local sources)


class CheckpointSyncer:
    def __init__(self, repo_id: str, token: str, endpoint: str | None = None, private: bool = True,
                 path_in_repo: str = "checkpoints", conn_id: str = "huggingface_default"):
        # Resolve the client now so a missing token fails at the start of training, not at its end.
        self._api, self._url = hub_api(token, endpoint, conn_id)
        self.repo_id, self.private, self.path_in_repo = repo_id, private, path_in_repo.strip("/")
        self._token, self._conn_id = token, conn_id
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._closing = False
        self._repo_ready = False
        self.errors: list[str] = []
        self.uploaded: list[dict] = []      # {"step", "commit_oid", "commit_url"} per finished upload
        self.skipped_steps: list[int] = []
        self._thread = threading.Thread(target=self._run, name="hub-checkpoint-sync", daemon=True)
        self._thread.start()

    def submit(self, local_dir: str, step: int) -> None:
        """Queue `local_dir` (the checkpoint of `step`) for upload and return at once."""
        if self._closing:
            raise PublishError("CheckpointSyncer.submit after close(): create a new syncer.")
        snapshot = _snapshot(local_dir) if storage.is_local(local_dir) else None
        with self._cond:
            if self._pending is not None:
                log.info("Checkpoint upload is behind: skipping step %d for step %d", self._pending.step, step)
                self.skipped_steps.append(self._pending.step)
                _cleanup(self._pending)
            self._pending = _Job(step, local_dir, snapshot)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> list[dict]:
        """Wait for the queued upload to finish; raise PublishError if any upload failed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise PublishError(f"A checkpoint upload to {self.repo_id} is still running after {timeout}s: the "
                               "Hub or the network is slow. Training results are safe in output_root; retry "
                               "the upload later or raise the timeout.")
        if self.errors:
            raise PublishError(f"{len(self.errors)} checkpoint upload(s) to {self.repo_id} failed; the last: "
                               f"{self.errors[-1]}")
        return list(self.uploaded)

    def __enter__(self) -> "CheckpointSyncer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # training already failed: wait for the upload, but report that failure, not ours
            self.close()
        except PublishError as err:
            log.warning("%s", err)

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
            except Exception as err:  # noqa: BLE001 - a background failure must be kept for close(), whatever it is
                message = scrub(str(err), self._token)
                log.warning("Checkpoint upload of step %d to %s failed (training goes on): %s",
                            job.step, self.repo_id, message)
                self.errors.append(message)
            finally:
                _cleanup(job)

    def _upload(self, job: _Job) -> None:
        with tempfile.TemporaryDirectory(prefix="mlm-ckpt-sync-") as tmp:
            folder = job.snapshot or storage.download_dir(job.source, tmp)
            action = f"uploading the step {job.step} checkpoint to {self.repo_id}"
            with hub_errors(action, self._token, self._url, self._conn_id):
                if not self._repo_ready:
                    self._api.create_repo(self.repo_id, private=self.private, exist_ok=True)
                    self._repo_ready = True
                info = self._api.upload_folder(
                    repo_id=self.repo_id, folder_path=folder, path_in_repo=self.path_in_repo,
                    delete_patterns="*", ignore_patterns=["*.tmp-*", "**/*.tmp-*"],
                    commit_message=f"Training checkpoint at step {job.step}")
        self.uploaded.append({"step": job.step, "commit_oid": info.oid, "commit_url": info.commit_url})
        log.info("Uploaded the step %d checkpoint to %s (%s)", job.step, self.repo_id, info.oid)


# Small files (the `checkpoint` state file) may be rewritten in place by the next save, so they are
# copied; big ones (weights, optimizer slots) get fresh names per save, so a hard link freezes them
# at no cost in time or space.
COPY_BELOW_BYTES = 1 << 20


def _snapshot(local_dir: str) -> str:
    """Freeze the checkpoint's files as they are now, so training may write the next one meanwhile."""
    src = storage.local_path(local_dir)
    if not os.path.isdir(src):
        raise PublishError(f"Checkpoint folder {local_dir} does not exist: submit the folder the checkpoint "
                           "was just written to.")
    dest = tempfile.mkdtemp(prefix="mlm-ckpt-snapshot-")
    for dirpath, _, names in os.walk(src):
        for name in names:
            if ".tmp-" in name:
                continue
            source = os.path.join(dirpath, name)
            target = os.path.join(dest, os.path.relpath(source, src))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.getsize(source) < COPY_BELOW_BYTES:
                shutil.copy2(source, target)
                continue
            try:
                os.link(source, target)
            except OSError:  # another filesystem, or links not supported
                shutil.copy2(source, target)
    return dest


def _cleanup(job: _Job) -> None:
    if job.snapshot:
        shutil.rmtree(job.snapshot, ignore_errors=True)
