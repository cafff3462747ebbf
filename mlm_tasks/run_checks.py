"""Checks a run makes of its inputs: the shard set it trains on, its earlier work, its output root.

    shard_set = load_manifest(cfg, fingerprint)           # complete, same max_length and tokenizer
    steps = plan_steps(cfg, shard_set, global_batch)      # the batch fits the train records
    check_resumable(run, fingerprint, shard_set.vocab_size)  # a checkpoint of this run is of this data
    check_writable(cfg.output_root)                       # a probe object written and removed

Shared by the steps that need them (validate, plan_shards, train, evaluate), so no step imports another.
"""
from __future__ import annotations

import hashlib
import math
import uuid

from mlm_tasks import storage
from mlm_tasks.config import ConfigError, PipelineConfig
from mlm_tasks.manifest import ShardSet
from mlm_tasks.paths import DataPaths, RunPaths, join


def load_manifest(cfg: PipelineConfig, fingerprint: str) -> ShardSet:
    """The complete shard set of `fingerprint`, checked against what this run asks for."""
    paths = DataPaths(cfg.output_root, fingerprint)
    shard_set = ShardSet.load(paths)
    if shard_set.max_length != cfg.shards.max_length:
        raise ConfigError(f"The shards at {paths.shards_dir} were built with max_length "
                          f"{shard_set.max_length} but this run asks for {cfg.shards.max_length}: "
                          "prepare data with the run's max_length, or set max_length to match.")
    tok_sha = hashlib.sha256(storage.read_bytes(join(paths.tokenizer, "tokenizer.json"))).hexdigest()
    if tok_sha != shard_set.tokenizer_sha256:
        raise ConfigError(f"The tokenizer at {paths.tokenizer} is not the one the shards were encoded "
                          "with (sha256 differs): delete the dataset folder and rerun plan_shards.")
    return shard_set



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



def check_writable(uri: str) -> None:
    """A probe object written and removed: a run that could not save its work fails now, not after hours."""
    probe = f"{uri.rstrip('/')}/_probes/{uuid.uuid4().hex}"
    try:
        storage.write_text(probe, "ok")
        storage.remove(probe)
    except Exception as err:  # any failure here means the run could not save its work
        raise ConfigError(f"Cannot write to output_root {uri}: {type(err).__name__}: {err}. Check the path "
                          "and its permissions.") from None
