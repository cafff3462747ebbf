"""Step publish: push the run's model (TensorFlow and PyTorch weights) with its card to the Hugging Face Hub.
HF_TOKEN=hf_... python -m mlm_tasks publish --config c.yaml --run-id my-run   # after the gate passed"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from mlm_tasks import paths, storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.downstream.scores import published_scores
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.hub.api import hub_api, hub_errors, push_folder
from mlm_tasks.model.pt_export import SAFETENSORS_NAME, export_pytorch_weights
from mlm_tasks.paths import RunContext, RunPaths, join
from mlm_tasks.reporting.card import read_run_artifacts, write_model_card
from mlm_tasks.results import ModelCommit

log = logging.getLogger(__name__)


def _add_pytorch_weights(folder: str, run: RunPaths) -> None:
    """A model saved before model.safetensors was written gets it now: PyTorch and transformers 5 need it."""
    present = set(os.listdir(folder))
    if SAFETENSORS_NAME not in present and "tf_model.h5" in present:
        log.info(
            "%s has no %s (saved by an older version): converting tf_model.h5 for PyTorch", run.model, SAFETENSORS_NAME
        )
        export_pytorch_weights(folder)


def publish(
    cfg: PipelineConfig,
    ctx: RunContext,
    *,
    token: str,
    endpoint: str | None = None,
    data_info: Mapping[str, Any] | None = None,
) -> ModelCommit:
    """Write the card into the run's model dir and push it to `publish.repo_id` in one commit (`endpoint` or
    HF_ENDPOINT: another Hub); records the metrics the next run's gate compares against."""
    run, (repo_id, conn_id) = ctx.run, (cfg.publish.repo_id, cfg.publish.hf_conn_id)
    if not repo_id:
        raise ConfigError("publish.repo_id is empty: set it to the Hub repo to push to, e.g. my-org/roberta-wiki.")
    done = storage.read_json_if_exists(run.published)
    if done and done.get("repo_id") == repo_id:
        log.info(
            "Run %s was already published to %s (commit %s); nothing to do", run.run_id, repo_id, done.get("commit_oid")
        )
        return done
    if not storage.exists(join(run.model, "config.json")):
        raise MissingArtifactError(f"No saved model at {run.model}: run train for run {run.run_id} first.")
    api, url = hub_api(token, endpoint, conn_id, cfg.publish.request_timeout_s)
    with hub_errors("checking the token", token, url, conn_id):
        user = api.whoami()["name"]
    write_model_card(cfg, run, data_info)
    artifacts = read_run_artifacts(run)
    metrics = artifacts["metrics"] or {}
    with tempfile.TemporaryDirectory(prefix="mlm-publish-") as tmp:
        folder = storage.download_dir(run.model, tmp)
        _add_pytorch_weights(folder, run)
        with hub_errors(f"publishing {run.model} to {repo_id}", token, url, conn_id):
            about = ", ".join(f"{k}={metrics[k]}" for k in ("loss", "accuracy") if k in metrics)
            message = f"Upload model from run {run.run_id}"
            info, files = push_folder(api, repo_id, folder, cfg.publish.private, message, about)
    result: ModelCommit = {
        "repo_id": repo_id,
        "commit_url": info.commit_url,
        "commit_oid": info.oid,
        "files": files,
        "private": cfg.publish.private,
        "run_id": run.run_id,
    }
    log.info("Published run %s as %s to %s (%d files, user %s)", run.run_id, info.oid, repo_id, len(files), user)
    scores = published_scores(artifacts["downstream"])
    baseline = {**metrics, "downstream": scores, "run_id": run.run_id, "repo_id": repo_id, "commit_oid": info.oid}
    storage.write_json(paths.published_metrics(cfg.output_root, repo_id, cfg.publish.releases_root), baseline)
    storage.write_json(run.published, result)  # last: the step's completion marker
    return result
