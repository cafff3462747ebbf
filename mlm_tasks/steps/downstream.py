"""Step downstream: fine-tune the trained encoder on each of `downstream.tasks`; runs/<run>/eval/downstream.json.
python -m mlm_tasks downstream --config configs/default.yaml --run-id my-run"""

from __future__ import annotations

import logging
import tempfile

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.downstream.suite import reflag, score_model, scored_settings
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import RunContext, join
from mlm_tasks.results import DownstreamResult

log = logging.getLogger(__name__)


def downstream(cfg: PipelineConfig, ctx: RunContext) -> DownstreamResult:
    """Fine-tune and score run `ctx.run_id`'s model on every configured task; the table's rows."""
    run, settings = ctx.run, scored_settings(cfg.downstream)
    if not cfg.downstream.tasks:
        log.info("downstream.tasks is empty: no downstream evaluation for run %s", run.run_id)
        return {"tasks": [], "skipped": [], "model": run.model, "settings": settings, "elapsed_s": 0.0}
    done = storage.read_json_if_exists(run.downstream)
    if done and done.get("settings") == settings and all("interval" in t["pretrained"] for t in done["tasks"]):
        log.info("Downstream scores already at %s for these settings: nothing to do", run.downstream)
        return reflag(done, cfg.downstream)  # the flags' thresholds may have changed since
    if not storage.exists(join(run.model, "config.json")):
        raise MissingArtifactError(f"No trained model at {run.model}: run the train step for run {run.run_id} first.")
    with tempfile.TemporaryDirectory(prefix="mlm-downstream-") as tmp:
        result = score_model(cfg, storage.download_dir(run.model, tmp), run.model)
    storage.write_json(run.downstream, result)
    log.info("Downstream scores of %d task(s) in %.0fs: %s", len(result["tasks"]), result["elapsed_s"], run.downstream)
    return result
