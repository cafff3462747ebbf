"""Synthetic run artifacts in the formats train/evaluate/infer write, for tests of the steps after them
(gate, publish, report) without training anything.

    run = make_run(output_root, "run-1", metrics={"loss": 4.2, "accuracy": 0.31})
"""

from __future__ import annotations

import json
import math

import numpy as np

from mlm_tasks import storage
from mlm_tasks.paths import RunPaths, join


def _safetensors(tensors: dict) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "pt"})


MODEL_FILES = {
    "config.json": json.dumps({"model_type": "roberta", "vocab_size": 1000, "hidden_size": 128}).encode(),
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "Unigram"}}).encode(),
    "tokenizer_config.json": json.dumps({"model_max_length": 128}).encode(),
    "special_tokens_map.json": json.dumps({"mask_token": "<mask>"}).encode(),
    # Binary weights: the Hub keeps *.h5 and *.safetensors in LFS, so this exercises the LFS batch + PUT path.
    "tf_model.h5": bytes(range(256)) * 40,
    "model.safetensors": _safetensors({"lm_head.bias": np.arange(1000, dtype=np.float32)}),
}
METRICS = {
    "loss": 4.5,
    "perplexity": math.exp(4.5),
    "accuracy": 0.30,
    "baseline_accuracy": 0.06,
    "untrained_accuracy": 0.001,
    "untrained_loss": 7.0,
    "masked_tokens": 1234,
    "split": "validation",
    "baseline_token": "\u2581the",
    "data_fingerprint": "0123456789abcdef",
}
PREDICTIONS = [
    {
        "probe": "The capital of France is <mask>.",
        "predictions": [
            {"token_str": " Paris", "score": 0.41, "sequence": "The capital of France is Paris."},
            {"token_str": " the", "score": 0.12, "sequence": "The capital of France is the."},
        ],
    },
    {
        "probe": "Anarchism is a political <mask>.",
        "predictions": [{"token_str": " philosophy", "score": 0.33, "sequence": "..."}],
    },
]
DATA_INFO = {
    "fingerprint": "0123456789abcdef",
    "records": {"train": 900, "validation": 50},
    "tokens": {"train": 115200, "validation": 6400},
    "vocab_size": 1000,
    "max_length": 128,
    "corpus": {"source": "embedded_wiki", "credit": "Text from English Wikipedia, CC BY-SA 4.0"},
}


def make_run(
    output_root: str,
    run_id: str,
    metrics: dict | None = METRICS,
    steps: int = 40,
    predictions: list | None = PREDICTIONS,
    model: bool = True,
    history: bool = True,
) -> RunPaths:
    run = RunPaths(output_root, run_id)
    if model:
        for name, data in MODEL_FILES.items():
            storage.write_bytes(join(run.model, name), data)
    if history:
        rows = [
            {
                "step": s,
                "loss": 7.0 * math.exp(-s / 25) + 2.0,
                "learning_rate": 1e-3 * min(1, s / 5) * (1 - s / (steps + 1)),
                "tokens_per_s": 5000.0,
                "elapsed_s": s * 0.1,
            }
            for s in range(1, steps + 1)
        ]
        storage.write_text(run.train_history, "".join(json.dumps(r) + "\n" for r in rows))
        storage.write_json(
            run.train_summary,
            {
                "steps": steps,
                "tokens_per_s": 5000.0,
                "first_loss": rows[0]["loss"],
                "last_loss": rows[-1]["loss"],
                "resumed_from_step": None,
                "elapsed_s": steps * 0.1,
            },
        )
    if metrics is not None:
        storage.write_json(run.eval_metrics, metrics)
    if predictions is not None:
        storage.write_json(run.predictions, predictions)
    storage.write_json(run.data_ref, DATA_INFO)
    return run
