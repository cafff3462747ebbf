"""Checkpoint sync to the Hugging Face Hub during training (`publish.sync_checkpoints`), never blocking it.

What Keras' `PushToHubCallback(save_strategy="epoch")` did, on the current huggingface_hub client.
`mlm_tasks.train` calls three hooks:

    sync = EpochSync.start(cfg, train_records, global_batch, strategy)   # None when sync is off
    if sync: sync.step_done(step, manager)      # in the loop, after the step's own checkpointing
    if sync: sync.finish(total_steps, manager)  # after the final checkpoint is saved

At each epoch end (every `train records // global batch` steps) and at the end of training, the
latest checkpoint is staged in a temporary folder (only that checkpoint's files plus a `checkpoint`
state file naming it: local files hard-linked, gs:// files downloaded first) and handed to
`publish_sync.CheckpointSyncer`, which uploads it to `<publish.repo_id>/checkpoints/` from a
background thread while training goes on. The token is HF_TOKEN from the training process's
environment (Airflow connections are not readable here). A failed upload is logged and never fails
training: the checkpoints stay safe in output_root.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.hub import PublishError
from mlm_tasks.paths import join
from mlm_tasks.publish_sync import CheckpointSyncer

log = logging.getLogger(__name__)


class EpochSync:
    def __init__(self, syncer: CheckpointSyncer, steps_per_epoch: int):
        self.syncer, self.steps_per_epoch = syncer, steps_per_epoch

    @classmethod
    def start(cls, cfg: PipelineConfig, train_records: int, global_batch: int, strategy=None) -> "EpochSync | None":
        if not cfg.publish.sync_checkpoints:
            return None
        if not cfg.publish.repo_id:
            raise ConfigError("publish.sync_checkpoints needs publish.repo_id, the Hub repo the checkpoints go to.")
        token = os.environ.get("HF_TOKEN")
        if not token:
            raise ConfigError("publish.sync_checkpoints is on but HF_TOKEN is not set in the training process's "
                              "environment: set it to a Hub write token, or turn publish.sync_checkpoints off.")
        task_id = getattr(getattr(strategy, "cluster_resolver", None), "task_id", 0) or 0
        if task_id != 0:  # multi-worker strategies: one upload is enough (TPU is single-client: always 0)
            log.info("Checkpoint sync runs on worker 0 only (this is worker %s)", task_id)
            return None
        steps_per_epoch = max(1, train_records // global_batch)
        syncer = CheckpointSyncer(cfg.publish.repo_id, token, private=cfg.publish.private,
                                  conn_id=cfg.publish.hf_conn_id)
        log.info("Syncing checkpoints to %s every %d steps (each epoch) and at the end of training",
                 cfg.publish.repo_id, steps_per_epoch)
        return cls(syncer, steps_per_epoch)

    def step_done(self, step: int, manager) -> None:
        """At an epoch end, save a checkpoint if this step has none yet, and queue it for upload."""
        if step % self.steps_per_epoch:
            return
        path = manager.latest_checkpoint
        if not path or not path.endswith(f"-{step}"):
            path = manager.save(checkpoint_number=step)
        self._submit(path, step)

    def finish(self, step: int, manager, timeout: float | None = 3600) -> list[dict]:
        """Queue the final checkpoint, wait for the uploads; failures are logged, not raised."""
        if manager.latest_checkpoint:
            self._submit(manager.latest_checkpoint, step)
        try:
            uploaded = self.syncer.close(timeout)
        except PublishError as err:
            log.warning("Checkpoint sync to the Hub failed (training is complete; checkpoints are in "
                        "output_root): %s", err)
            return list(self.syncer.uploaded)
        log.info("Synced %d checkpoint(s) to %s (steps %s)", len(uploaded), self.syncer.repo_id,
                 [u["step"] for u in uploaded])
        return uploaded

    def _submit(self, checkpoint_path: str, step: int) -> None:
        staged = stage_checkpoint(checkpoint_path)
        try:
            self.syncer.submit(staged, step)  # snapshots the files, so the staging folder can go now
        finally:
            shutil.rmtree(staged, ignore_errors=True)


def stage_checkpoint(checkpoint_path: str) -> str:
    """A local temp folder holding only `checkpoint_path`'s files (e.g. .../ckpt-40.index and .data-*)
    and a `checkpoint` state file naming it, so `tf.train.latest_checkpoint` finds it after a download."""
    folder, prefix = checkpoint_path.rsplit("/", 1)
    staged = tempfile.mkdtemp(prefix="mlm-ckpt-stage-")
    t0 = time.time()
    names = [uri.rsplit("/", 1)[1] for uri in storage.listdir(folder)]
    names = [n for n in names if n.startswith(prefix + ".") and ".tmp-" not in n]
    if not names:
        raise PublishError(f"No files of checkpoint {checkpoint_path}: it was not saved, or was deleted.")
    for name in names:
        target = os.path.join(staged, name)
        if storage.is_local(folder):
            try:
                os.link(os.path.join(storage.local_path(folder), name), target)
                continue
            except OSError:  # another filesystem
                pass
        with open(target, "wb") as f:  # gs://: training waits for this download, not for the upload
            f.write(storage.read_bytes(join(folder, name)))
    with open(os.path.join(staged, "checkpoint"), "w", encoding="utf-8") as f:
        f.write(f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
    if not storage.is_local(folder):
        log.info("Downloaded checkpoint %s for the Hub sync in %.1fs", checkpoint_path, time.time() - t0)
    return staged
