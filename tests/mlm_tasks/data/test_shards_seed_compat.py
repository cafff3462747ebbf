"""Our shards read by the consumer logic of Hugging Face's TF/TPU language-modeling scripts.

The functions below are copied from huggingface/transformers examples/tensorflow/language-modeling-tpu/
run_mlm.py (count_samples, prepare_dataset, and main()'s decode_fn and mask_with_collator), changed only
where they read the script's global `args` (max_length, batch size, mlm_probability are parameters here)
and with `AUTO = tf.data.AUTOTUNE` as the script defines it. They run on a shard set written by the one
writer, in one partition (build_shard_set) and in three (the DAGs' fan-out, with the merge's tail shards).

    pytest tests/mlm_tasks/data/test_shards_seed_compat.py
"""

import re
import shutil

import numpy as np
import pytest

from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.paths import SPLITS, DataPaths


# --- copied from run_mlm.py (language-modeling-tpu) ---------------------------------------------------
def count_samples(file_list):
    num_samples = 0
    for file in file_list:
        filename = file.split("/")[-1]
        sample_count = re.search(r"-\d+-(\d+)\.tfrecord", filename).group(1)
        sample_count = int(sample_count)
        num_samples += sample_count

    return num_samples


def prepare_dataset(records, decode_fn, mask_fn, batch_size, shuffle, shuffle_buffer_size=None):
    import tensorflow as tf

    AUTO = tf.data.AUTOTUNE
    num_samples = count_samples(records)
    dataset = tf.data.Dataset.from_tensor_slices(records)
    if shuffle:
        dataset = dataset.shuffle(len(dataset))
    dataset = tf.data.TFRecordDataset(dataset, num_parallel_reads=AUTO)
    # TF can't infer the total sample count because it doesn't read all the records yet, so we assert it here
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_samples))
    dataset = dataset.map(decode_fn, num_parallel_calls=AUTO)
    if shuffle:
        assert shuffle_buffer_size is not None
        dataset = dataset.shuffle(shuffle_buffer_size)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(mask_fn, num_parallel_calls=AUTO)
    dataset = dataset.prefetch(AUTO)
    return dataset


def make_decode_fn(max_length):
    import tensorflow as tf

    def decode_fn(example):
        features = {
            "input_ids": tf.io.FixedLenFeature(dtype=tf.int64, shape=(max_length,)),
            "attention_mask": tf.io.FixedLenFeature(dtype=tf.int64, shape=(max_length,)),
        }
        return tf.io.parse_single_example(example, features)

    return decode_fn


def make_mask_fn(tokenizer, mlm_probability=0.15):
    import tensorflow as tf
    from transformers import DataCollatorForLanguageModeling

    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm_probability=mlm_probability, mlm=True, return_tensors="tf"
    )

    def mask_with_collator(batch):
        # TF really needs an isin() function
        special_tokens_mask = (
            ~tf.cast(batch["attention_mask"], tf.bool)
            | (batch["input_ids"] == tokenizer.cls_token_id)
            | (batch["input_ids"] == tokenizer.sep_token_id)
        )
        batch["input_ids"], batch["labels"] = data_collator.tf_mask_tokens(
            batch["input_ids"],
            vocab_size=len(tokenizer),
            mask_token_id=tokenizer.mask_token_id,
            special_tokens_mask=special_tokens_mask,
        )
        return batch

    return mask_with_collator


# ------------------------------------------------------------------------------------------------------


def _originals(batches) -> list[tuple]:
    """The unmasked rows behind masked batches: the label where a position was selected, else the input."""
    rows = []
    for b in batches:
        ids, labels = b["input_ids"].numpy(), b["labels"].numpy()
        rows.extend(map(tuple, np.where(labels != -100, labels, ids)))
    return rows


@pytest.fixture(scope="module")
def shard_sets(tiny_prepared, tmp_path_factory):
    """The tiny set in one partition (build_shard_set) and the same data in three (the DAGs' fan-out)."""
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps import prepare_partitions
    from mlm_tasks.steps.merge_shards import merge_shards
    from mlm_tasks.steps.plan_shards import plan_shards
    from mlm_tasks.steps.write_shards import write_shards

    cfg, data = tiny_prepared
    one = DataPaths(cfg.output_root, data["fingerprint"])
    fanned = cfg.model_copy(
        update={
            "output_root": str(tmp_path_factory.mktemp("fan") / "out"),
            "shards": cfg.shards.model_copy(update={"partitions": 3}),
        }
    )
    three = DataPaths(fanned.output_root, data["fingerprint"])
    shutil.copytree(one.tokenizer, three.tokenizer)  # the same tokenizer: no retraining
    plan = plan_shards(fanned, RunContext.of(fanned))
    ctx = RunContext.of(fanned, fingerprint=plan["fingerprint"])
    prepare_partitions(fanned, ctx, plan)  # the copied tokenizer is reused
    for p in plan["partitions"]:
        write_shards(fanned, ctx, part=p["part"], num_parts=p["num_parts"])
    merge_shards(fanned, ctx, plan=plan)
    return {"1 partition": ShardSet.load(one), "3 partitions": ShardSet.load(three)}


@pytest.mark.parametrize("layout", ["1 partition", "3 partitions"])
def test_hugging_face_scripts_read_our_shards(shard_sets, layout):
    import tensorflow as tf

    from mlm_tasks.data.input import mlm_dataset
    from mlm_tasks.data.tokenizer import load_tokenizer

    shard_set = shard_sets[layout]
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    if layout == "3 partitions":
        assert any("-tail-" in u for s in SPLITS for u in shard_set.shard_uris(s))  # the merge's names too
    for split in ("train", "validation"):
        # The script lists the split's folder, as run_mlm.py does: exactly the manifest's files.
        records = tf.io.gfile.glob(f"{shard_set.paths.shards(split)}/*.tfrecord")
        assert sorted(records) == sorted(shard_set.shard_uris(split))
        assert count_samples(records) == shard_set.records(split) > 0

        # Every record parses with both features; batch 1 keeps every record (drop_remainder=True).
        ds = prepare_dataset(
            records, make_decode_fn(shard_set.max_length), make_mask_fn(tokenizer), batch_size=1, shuffle=False
        )
        assert int(ds.cardinality()) == shard_set.records(split)
        theirs = list(ds)
        assert len(theirs) == shard_set.records(split)
        assert all(b["attention_mask"].numpy().all() for b in theirs)
        labels = np.concatenate([b["labels"].numpy().ravel() for b in theirs])
        assert 0.10 < (labels != -100).mean() < 0.20  # their collator masks ~15%

        # The same rows our own reader yields (order aside: both interleave files).
        ours = mlm_dataset(shard_set, split, tokenizer, 64, training=False)
        assert sorted(_originals(theirs)) == sorted(_originals(ours))


def test_shuffled_training_pipeline_runs_as_in_the_script(shard_sets):
    """The script's training path: shuffled files and records, full batches, assert_cardinality holds."""
    import tensorflow as tf

    from mlm_tasks.data.tokenizer import load_tokenizer

    shard_set = shard_sets["3 partitions"]
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    records = tf.io.gfile.glob(f"{shard_set.paths.shards('train')}/*.tfrecord")
    ds = prepare_dataset(
        records,
        make_decode_fn(shard_set.max_length),
        make_mask_fn(tokenizer),
        batch_size=32,
        shuffle=True,
        shuffle_buffer_size=1000,
    )
    batches = list(ds)
    assert len(batches) == shard_set.records("train") // 32
    assert all(b["input_ids"].shape == (32, shard_set.max_length) for b in batches)
