"""Step: publish to the Hugging Face Hub — the model (TensorFlow and PyTorch weights) with its card,
the tokenizer, and checkpoints.

    result = publish_model(cfg, run, token)             # after the gate passed; returns commit url/oid
    result = publish_tokenizer(cfg, data_paths, token)  # the tokenizer alone, to publish.tokenizer_repo_id
    with CheckpointSyncer(repo_id, token) as sync:      # during training, never blocking it
        sync.submit(checkpoint_dir, step)

The token is an argument: the DAG reads it from the Airflow connection `publish.hf_conn_id`. It never
reaches logs, error messages, XCom or files. `endpoint` (or HF_ENDPOINT) selects another Hub, such
as the loopback fake the tests use.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile

from mlm_tasks import paths, storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.hub import PublishError, hub_api, hub_errors
from mlm_tasks.model_card import read_run_artifacts, write_model_card
from mlm_tasks.paths import DataPaths, RunPaths, join
from mlm_tasks.pt_export import SAFETENSORS_NAME, export_pytorch_weights
from mlm_tasks.hub_sync import CheckpointSyncer

__all__ = ["PublishError", "publish_model", "publish_tokenizer", "write_model_card", "CheckpointSyncer"]
log = logging.getLogger(__name__)
# storage.write_bytes' in-flight temporary files; a concurrent writer's leftovers must not be published.
IGNORE_PATTERNS = ["*.tmp-*", "**/*.tmp-*"]


def _local_files(folder: str) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if ".tmp-" not in name:
                out.append(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
    return sorted(out)


def _check_visibility(api, repo_id: str, private: bool) -> None:
    actual = api.repo_info(repo_id).private
    if private and not actual:
        raise PublishError(f"publish.private is true but the existing Hub repo {repo_id} is public: make it "
                           "private on the Hub, or set publish.private=false if public is intended.")
    if actual and not private:
        log.warning("publish.private is false but %s already exists as a private repo; it stays private", repo_id)


def _add_pytorch_weights(folder: str, run: RunPaths) -> None:
    """A model saved before `save` wrote model.safetensors gets it now: without it, PyTorch and
    transformers 5.x users cannot load the repo at all."""
    present = set(os.listdir(folder))
    if SAFETENSORS_NAME not in present and "tf_model.h5" in present:
        log.info("%s has no %s (saved by an older version): converting tf_model.h5 for PyTorch users",
                 run.model, SAFETENSORS_NAME)
        export_pytorch_weights(folder)


def publish_model(cfg: PipelineConfig, run: RunPaths, token: str, endpoint: str | None = None,
                  data_info: dict | None = None) -> dict:
    """Write the card into the run's model dir and push that dir to `publish.repo_id` in one commit.

    Returns {"repo_id", "commit_url", "commit_oid", "files", "private", "run_id"} and records the run's
    metrics at paths.published_metrics(...) so the next run's gate compares against them."""
    repo_id, conn_id = cfg.publish.repo_id, cfg.publish.hf_conn_id
    if not repo_id:
        raise PublishError("publish.repo_id is empty: set it to the Hub repo to push to, e.g. my-org/roberta-wiki.")
    done = storage.read_json_if_exists(run.published)
    if done and done.get("repo_id") == repo_id:
        log.info("Run %s was already published to %s (commit %s); nothing to do", run.run_id, repo_id,
                 done.get("commit_oid"))
        return done
    if not storage.exists(join(run.model, "config.json")):
        raise PublishError(f"No saved model at {run.model}: run train for run {run.run_id} first.")
    api, url = hub_api(token, endpoint, conn_id)
    with hub_errors("checking the token", token, url, conn_id):
        user = api.whoami()["name"]
    write_model_card(cfg, run, data_info)
    metrics = read_run_artifacts(run)["metrics"] or {}
    with tempfile.TemporaryDirectory(prefix="mlm-publish-") as tmp:
        folder = storage.download_dir(run.model, tmp)
        _add_pytorch_weights(folder, run)
        with hub_errors(f"creating {repo_id}", token, url, conn_id):
            api.create_repo(repo_id, private=cfg.publish.private, exist_ok=True)
            _check_visibility(api, repo_id, cfg.publish.private)
        with hub_errors(f"uploading {run.model} to {repo_id}", token, url, conn_id):
            info = api.upload_folder(
                repo_id=repo_id, folder_path=folder, ignore_patterns=list(IGNORE_PATTERNS),
                commit_message=f"Upload model from run {run.run_id}",
                commit_description=", ".join(f"{k}={metrics[k]}" for k in ("loss", "accuracy") if k in metrics))
        files = _local_files(folder)
    result = {"repo_id": repo_id, "commit_url": info.commit_url, "commit_oid": info.oid, "files": files,
              "private": cfg.publish.private, "run_id": run.run_id}
    log.info("Published run %s as %s to %s (%d files, user %s)", run.run_id, info.oid, repo_id, len(files), user)
    storage.write_json(paths.published_metrics(cfg.output_root, repo_id),
                       {**metrics, "run_id": run.run_id, "repo_id": repo_id, "commit_oid": info.oid})
    storage.write_json(run.published, result)  # last: the step's completion marker
    return result


TOKENIZER_CARD = """---
language: en
license: {license}
tags: [tokenizer, unigram, roberta]
---

# {name}

Unigram tokenizer (PreTrainedTokenizerFast, RoBERTa special tokens) trained on the corpus with data
fingerprint `{fingerprint}`. Load it with `AutoTokenizer.from_pretrained("{repo_id}")`.
"""


def publish_tokenizer(cfg: PipelineConfig, data: DataPaths, token: str, endpoint: str | None = None) -> dict:
    """Push the tokenizer of `data` (alone, with a short card) to `publish.tokenizer_repo_id`."""
    repo_id, conn_id = cfg.publish.tokenizer_repo_id, cfg.publish.hf_conn_id
    if not repo_id:
        raise PublishError("publish.tokenizer_repo_id is empty: set it to the Hub repo for the tokenizer.")
    if not storage.exists(join(data.tokenizer, "tokenizer.json")):
        raise PublishError(f"No tokenizer at {data.tokenizer}: run prepare_data first.")
    api, url = hub_api(token, endpoint, conn_id)
    with tempfile.TemporaryDirectory(prefix="mlm-tokenizer-") as tmp:
        # Copy: the tokenizer dir is create-only data shared by runs; the card must not land in it.
        src = storage.download_dir(data.tokenizer, os.path.join(tmp, "download"))
        folder = os.path.join(tmp, "upload")
        shutil.copytree(src, folder, ignore=shutil.ignore_patterns("*.tmp-*"))
        with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
            f.write(TOKENIZER_CARD.format(license=cfg.publish.license, name=repo_id.split("/")[-1],
                                          fingerprint=data.fingerprint, repo_id=repo_id))
        with hub_errors(f"publishing the tokenizer to {repo_id}", token, url, conn_id):
            api.create_repo(repo_id, private=cfg.publish.private, exist_ok=True)
            _check_visibility(api, repo_id, cfg.publish.private)
            info = api.upload_folder(repo_id=repo_id, folder_path=folder,
                                     commit_message=f"Upload tokenizer for data {data.fingerprint}")
        files = _local_files(folder)
    log.info("Published tokenizer %s to %s as %s", data.fingerprint, repo_id, info.oid)
    return {"repo_id": repo_id, "commit_url": info.commit_url, "commit_oid": info.oid, "files": files,
            "fingerprint": data.fingerprint}
