"""The tf.data input pipeline: read shards, shuffle, batch, mask in-graph, prefetch.

    ds = mlm_dataset(shard_set, "train", tokenizer, global_batch, seed=cfg.train.seed, input_context=ctx)
docs/data.md#reading-shards-in-training
"""

from __future__ import annotations

import logging
import re

from mlm_tasks import storage
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.data.tfrecord import count_records
from mlm_tasks.data.word_mask import WholeWordMasker
from mlm_tasks.errors import ConfigError

log = logging.getLogger(__name__)


def make_masker(
    tokenizer,
    mlm_probability: float,
    whole_word_mask: bool = False,
    max_predictions: int = 0,
    replace: tuple[float, float] = (0.8, 0.1),
):
    """`mask(ids, rng) -> (masked ids, labels)` for a batch of int32 ids, in graph, labels -100 where nothing is
    masked: single tokens, or whole words (data/word_mask.py); `replace`: the shares of the selected tokens
    shown as <mask> and as a random token (the rest unchanged). Special tokens are never masked."""
    import tensorflow as tf
    from transformers import DataCollatorForLanguageModeling

    special_ids = tf.constant(sorted(tokenizer.all_special_ids), dtype=tf.int32)
    words = WholeWordMasker(tokenizer, mlm_probability, max_predictions) if whole_word_mask else None
    mask_share, random_share = replace
    collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm=True,
        # Whole words: at 1 the collator selects every position its special-tokens mask leaves, so "not
        # selected" as that mask makes its selection the words', and its 80/10/10 applies per token.
        mlm_probability=1.0 if words is not None else mlm_probability,
        mask_replace_prob=mask_share,
        random_replace_prob=min(random_share, 1.0 - mask_share),  # a sum of 1 may round above it
        return_tensors="tf",
    )

    def mask(ids, rng):
        unmasked = tf.reduce_any(ids[..., None] == special_ids, axis=-1)  # what the collator may not select
        if words is not None:
            unmasked = ~words(ids, unmasked, rng)
        collator.generator = rng
        return collator.tf_mask_tokens(
            ids, vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, special_tokens_mask=unmasked
        )

    return mask


class BatchSeededRng:
    """Stands in for the collator's `tf.random.Generator`: stateless draws keyed by (seed, batch index), so
    batch k gets the same masks in a resumed run, and every model scored on a split the same masks."""

    def __init__(self, seed: int, batch_index):
        self.seed, self.batch_index, self.calls = seed, batch_index, 0

    def uniform(self, shape, minval=0, maxval=None, dtype=None):
        import tensorflow as tf

        self.calls += 1  # counted at trace time: each draw site gets its own stream
        key = tf.stack([tf.constant(self.seed * 1_000_003 + self.calls, tf.int64), tf.cast(self.batch_index, tf.int64)])
        dtype = dtype or tf.float32
        if maxval is None:
            maxval = 1 if dtype.is_floating else None
        return tf.random.stateless_uniform(shape, seed=key, minval=minval, maxval=maxval, dtype=dtype)


def shard_policy(num_files: int, num_pipelines: int) -> tuple[str, str]:
    """("file" or "data", why): FILE when every input pipeline gets at least one whole file."""
    if num_files >= num_pipelines:
        return "file", (
            f"{num_files} shard files >= {num_pipelines} input pipeline(s): each pipeline reads "
            f"only its own ~{num_files // num_pipelines} file(s)"
        )
    return "data", (
        f"only {num_files} shard files for {num_pipelines} input pipelines: every pipeline reads "
        f"every file and keeps its 1/{num_pipelines} of each batch (write smaller shards, "
        f"at least {num_pipelines} files, to read each file once)"
    )


def mlm_dataset(
    shard_set: ShardSet,
    split: str,
    tokenizer,
    batch_size: int,
    *,
    mlm_probability: float = 0.15,
    whole_word_mask: bool = False,
    max_predictions: int = 0,
    replace: tuple[float, float] = (0.8, 0.1),
    seed: int = 0,
    training: bool = True,
    shuffle_buffer: int = 10_000,
    skip_batches: int = 0,
    take_batches: int | None = None,
    input_context=None,
    weights: dict[str, float] | None = None,
):
    """Batches of {"input_ids", "attention_mask", "labels"} (labels = -100 where nothing is masked).
    training=True: shuffled, repeated, `skip_batches` skipped (a resumed run), `take_batches` long;
    training=False: one ordered pass. `input_context`: `batch_size` is the global batch, split per replica.
    `weights` (a mixture's, by source name; training): each example drawn from a source chosen by weight."""
    import tensorflow as tf

    max_length = shard_set.max_length
    pipelines, pipeline_id, per_replica = _pipeline_share(batch_size, input_context)
    step_batch = batch_size // pipelines  # this pipeline's examples per step
    by_source = shard_set.source_shard_uris(split) if training and weights else {}
    if by_source:
        policy, ds = "file", _weighted_records(by_source, weights or {}, pipelines, pipeline_id, seed, shuffle_buffer)
    else:
        files = shard_set.shard_uris(split)
        policy, why = shard_policy(len(files), pipelines)
        log.info("Input pipeline %d of %d shards %s by %s: %s", pipeline_id + 1, pipelines, split, policy.upper(), why)
        if policy == "file":
            files = files[pipeline_id::pipelines]  # disjoint, and together every file
        ds = _records(files, training, seed, shuffle_buffer)
    mask = make_masker(tokenizer, mlm_probability, whole_word_mask, max_predictions, replace)
    ds = ds.batch(batch_size if policy == "data" else step_batch, drop_remainder=training).enumerate()
    if skip_batches:
        ds = ds.skip(skip_batches)  # before parsing and masking: cheap; batch indices stay exact
    if take_batches is not None:
        ds = ds.take(take_batches)

    feature = {"input_ids": tf.io.FixedLenFeature([max_length], tf.int64)}

    def parse_and_mask(index, serialized):
        if policy == "data":  # this pipeline's slice of the global batch, cut before the costly parse
            serialized = serialized[pipeline_id * step_batch : (pipeline_id + 1) * step_batch]
        ids = tf.cast(tf.io.parse_example(serialized, feature)["input_ids"], tf.int32)
        # Each (step, pipeline) its own masks; on one pipeline the key is the step.
        masked, labels = mask(ids, BatchSeededRng(seed, index * pipelines + pipeline_id))
        # Chunks are packed, so every position is real text: the mask is all ones.
        return {"input_ids": masked, "attention_mask": tf.ones_like(ids), "labels": labels}

    ds = ds.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    if per_replica != step_batch:  # a host with several replicas: each takes one piece per step
        ds = ds.rebatch(per_replica, drop_remainder=True)
    options = tf.data.Options()
    options.deterministic = True
    # Sharding is done above from input_context; tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def _records(files: list[str], training: bool, seed: int, shuffle_buffer: int):
    """The serialized records of `files`: in order, or shuffled (files, then a buffer) and repeated."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(files)
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(4, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds


def _weighted_records(
    by_source: dict[str, list[str]], weights: dict[str, float], pipelines: int, pipeline_id: int, seed: int, buffer: int
):
    """A mixture's train records, each from a source drawn by weight; each source shuffled and repeated on its
    own (a share of the shuffle buffer each). A pipeline reads its own files of a source, or, when it has
    fewer files than pipelines, every pipelines-th record of all of them."""
    import tensorflow as tf

    total = sum(weights[name] for name in by_source)
    streams, shares = [], []
    for i, (name, files) in enumerate(by_source.items()):
        own = len(files) >= pipelines
        ds = _records(files[pipeline_id::pipelines] if own else files, True, seed + i, max(1, buffer // len(by_source)))
        streams.append(ds if own else ds.shard(pipelines, pipeline_id))
        shares.append(weights[name] / total)
        log.info(
            "Input pipeline %d of %d draws %.1f%% of its train examples from source %s (%s)",
            pipeline_id + 1,
            pipelines,
            100 * shares[-1],
            name,
            f"{len(files[pipeline_id::pipelines])} of its {len(files)} files"
            if own
            else f"all {len(files)} files, every {pipelines}th record",
        )
    return tf.data.Dataset.sample_from_datasets(streams, weights=shares, seed=seed, stop_on_empty_dataset=False)


def _pipeline_share(batch_size: int, input_context) -> tuple[int, int, int]:
    """(input pipelines, this pipeline's index, per-replica batch) of a global batch."""
    pipelines, pipeline_id, per_replica = 1, 0, batch_size
    if input_context is not None:
        pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
        per_replica = input_context.get_per_replica_batch_size(batch_size)
    if batch_size % pipelines:
        raise ValueError(
            f"Global batch {batch_size} does not split over {pipelines} input pipelines: "
            "use a batch that the replica count divides."
        )
    return pipelines, pipeline_id, per_replica


def damaged_shard_error(shard_set: ShardSet, split: str, err) -> ConfigError | None:
    """The `ConfigError` for TensorFlow's DataLossError `err` while reading `split`: the first shard our
    reader finds damaged. None if every shard reads clean: the caller lets the error be retried."""
    message = getattr(err, "message", str(err))  # in a tf.function: a graph traceback around the reader's words
    found = re.search(r"(corrupted|truncated) record at \d+", message)
    said = found.group(0) if found else message.strip().splitlines()[-1]
    for uri in shard_set.shard_uris(split):
        with storage.filesystem(uri).open(uri, "rb") as f:
            try:
                count_records(f, uri)
            except ConfigError as bad:
                return ConfigError(
                    f"Training read a damaged {split} shard (TensorFlow: {said}). {bad} Retrying "
                    "cannot fix it, so the run fails now."
                )
    return None
