"""What a training run will do, checked before it starts: its step count, and whether its earlier work fits.

    steps = plan_steps(cfg, shard_set, global_batch)          # the batch fits the train records
    check_resumable(run, fingerprint, shard_set.vocab_size)   # a checkpoint of this run is of this data
    per_call = steps_per_call(cfg.train.steps_per_call, device)  # optimizer steps per compiled call
    plan_lines(cfg, steps, vocab_size)   # tokens, FLOPs; on a TPU VM hours and cost, before spending

Shared by the steps that need them (validate, check_run, train), so no step imports another.
"""
from __future__ import annotations

import logging
import math
from typing import Any

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunPaths, join

log = logging.getLogger(__name__)


def checkpoint_vocab_size(checkpoint_dir: str) -> int | None:
    """Rows of the word-embedding matrix in the latest checkpoint under `checkpoint_dir` (None: none yet)."""
    if not storage.exists(join(checkpoint_dir, "checkpoint")):
        return None
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(checkpoint_dir)
    for name, shape in tf.train.list_variables(latest) if latest else []:
        # TFRobertaEmbeddings keeps the word embeddings as `weight` ([vocab, hidden]).
        if name.endswith("roberta/embeddings/weight/.ATTRIBUTES/VARIABLE_VALUE"):
            return int(shape[0])
    return None


def check_resumable(run: RunPaths, fingerprint: str, vocab_size: int) -> None:
    """A run's earlier work must come from the same data: resuming a checkpoint (or reusing a model)
    made with another tokenizer would fail deep in TensorFlow or, same size, silently mean nonsense."""
    summary = storage.read_json_if_exists(run.train_summary)
    if summary and summary.get("data_fingerprint", fingerprint) != fingerprint:
        raise ConfigError(f"Run {run.run_id} already trained on data {summary['data_fingerprint']}, not "
                          f"{fingerprint}: use a new run id for other data, or the run's own fingerprint.")
    found = checkpoint_vocab_size(run.checkpoints)
    if found is not None and found != vocab_size:
        raise ConfigError(f"The checkpoint in {run.checkpoints} has a vocabulary of {found} but the tokenizer "
                          f"of data {fingerprint} has {vocab_size}: the model and tokenizer vocab sizes differ. "
                          "Use a new run id, or delete the checkpoints to start over with this data.")


def plan_steps(cfg: PipelineConfig, shard_set: ShardSet, global_batch: int) -> int:
    """The run's step count (train.steps, or epochs over the train records), once the batch fits them."""
    records = shard_set.records("train")
    if global_batch > records:
        raise ConfigError(f"Global batch {global_batch} is larger than the {records} train records: lower "
                          "batch_size or add data.")
    return cfg.train.steps or max(1, math.ceil(cfg.train.epochs * records / global_batch))


# train.steps_per_call "auto": on CPU the host is the device, a call per step costs nothing; on an
# accelerator a small model's step takes about as long as the host's dispatch, so a call runs many.
AUTO_STEPS_PER_CALL = {"cpu": 1, "gpu": 16, "tpu": 64}


def steps_per_call(setting: int | str, device: str) -> int:
    """Optimizer steps per call of the compiled training loop on `device` (cpu, gpu or tpu)."""
    return AUTO_STEPS_PER_CALL[device] if setting == "auto" else int(setting)


def crossed(every: int, first: int, last: int) -> bool:
    """Whether steps first..last (one call of the loop) hold a multiple of `every`."""
    return every > 0 and last // every > (first - 1) // every


def planned_replicas(cfg: PipelineConfig) -> int:
    """Replicas the run will train on, as far as the config tells: a TPU slice's chips (v4, v5e and v5p
    chips are one replica each), else 1 (the training host finds its GPUs itself)."""
    if cfg.compute != "tpu_vm":
        return 1
    from mlm_tasks.tpu.prices import chips

    return chips(cfg.tpu.accelerator_type)


def plan_lines(cfg: PipelineConfig, steps: int, vocab_size: int, base_config: dict[str, Any] | None = None,
               replicas: int | None = None) -> list[str]:
    """What the run will cost, before it spends: tokens, steps and FLOPs; on a TPU VM the hours at
    ASSUMED_MFU of the slice's peak and their price on-demand and Spot."""
    from mlm_tasks.model.flops import PEAKS, flops_per_token
    from mlm_tasks.tpu import prices

    replicas = replicas or planned_replicas(cfg)
    dims = base_config or {**cfg.model.shape().model_dump(), "vocab_size": vocab_size}
    per_token = flops_per_token(dims, cfg.shards.max_length, cfg.train.max_predictions_per_seq)
    tokens = steps * cfg.train.batch_size * replicas * cfg.shards.max_length
    lines = [f"Plan: {steps:,} steps × global batch {cfg.train.batch_size * replicas} × {cfg.shards.max_length} "
             f"tokens = {tokens:,} tokens; {per_token / 1e6:,.1f} MFLOP per token, {tokens * per_token:.3g} FLOP "
             "in all."]
    if cfg.train.budget_minutes:
        cap = f"at most {cfg.train.steps:,}" if cfg.train.steps else "no cap"
        lines.append(f"train.budget_minutes={cfg.train.budget_minutes:g}: train fixes the step count from its "
                     f"measured step time ({cap}); the figures here are for {steps:,} steps.")
    if cfg.compute == "tpu_vm":
        generation = cfg.tpu.accelerator_type.split("-", 1)[0]
        peak = PEAKS.get(f"tpu-{generation}", {}).get("bf16")
        if peak is None:
            return [*lines, f"No bf16 peak for {cfg.tpu.accelerator_type} in mlm_tasks/model/flops.py: no estimate."]
        hours = tokens * per_token / (replicas * peak * prices.ASSUMED_MFU) / 3600
        costs = {spot: prices.hourly(cfg.tpu, spot) for spot in (False, True)}
        cost_text = ", ".join(f"{'Spot' if spot else 'on-demand'} ${rate * hours:,.2f} (${rate:,.2f}/h)"
                              for spot, rate in costs.items() if rate is not None) or "no price known"
        lines.append(f"Estimate on {cfg.tpu.accelerator_type} ({replicas} chips × {peak / 1e12:.0f} TFLOP/s bf16) at "
                     f"{100 * prices.ASSUMED_MFU:.0f}% MFU: {hours:.2f} h of training; {cost_text} "
                     f"[{prices.source(cfg.tpu)}], plus the VM's start and the steps around training.")
    return lines
