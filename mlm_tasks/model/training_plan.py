"""What a training run will do, checked before it starts: its step count, and whether its earlier work fits.

    steps = plan_steps(cfg, shard_set, global_batch)          # the batch fits the train records
    check_resumable(run, fingerprint, shard_set.vocab_size)   # a checkpoint of this run is of this data
    per_call = steps_per_call(cfg.train.steps_per_call, device)  # optimizer steps per compiled call

Shared by the steps that need them (validate, check_run, train), so no step imports another.
"""
from __future__ import annotations

import math

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import RunPaths, join


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
