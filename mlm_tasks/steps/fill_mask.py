"""Step fill_mask: the trained model's top predictions for each `infer.probes` sentence (one <mask> each).
python -m mlm_tasks fill_mask --config configs/default.yaml --run-id my-run"""

from __future__ import annotations

import logging
import tempfile

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.paths import RunContext
from mlm_tasks.results import Prediction, ProbePredictions

log = logging.getLogger(__name__)


def fill_mask(cfg: PipelineConfig, ctx: RunContext) -> list[ProbePredictions]:
    from transformers import pipeline

    from mlm_tasks.model.roberta import load_masked_lm

    run, run_id = ctx.run, ctx.run_id
    for probe in cfg.infer.probes:
        if probe.count("<mask>") != 1:
            raise ConfigError(f"Probe {probe!r} must contain exactly one <mask>.")
    if not storage.exists(run.train_summary):
        raise MissingArtifactError(f"No trained model for run {run_id}: run the train step first.")
    with tempfile.TemporaryDirectory() as tmp:
        local = storage.download_dir(run.model, tmp)
        # dtype=None: without torch installed the pipeline's default dtype lookup fails.
        model = load_masked_lm(local)
        fill = pipeline("fill-mask", model=model, tokenizer=local, framework="tf", dtype=None, top_k=cfg.infer.top_k)
        results: list[ProbePredictions] = []
        for probe in cfg.infer.probes:
            preds: list[Prediction] = [
                {"token_str": p["token_str"].strip(), "score": float(p["score"]), "sequence": p["sequence"]}
                for p in fill(probe)
            ]
            results.append({"probe": probe, "predictions": preds})
            log.info("%s -> %s", probe, ", ".join(f"{p['token_str']!r} {p['score']:.2f}" for p in preds))
    storage.write_json(run.predictions, results)
    return results
