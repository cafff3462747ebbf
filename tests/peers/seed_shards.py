"""The reference shard writer: Hugging Face's language-modeling-tpu `prepare_tfrecord_shards.py`, as a function.

    total = write_like_prepare_tfrecord_shards(rows, tokenizer_dir, "out/train")
    offset = damage_second_record(path, "data")    # what a bad copy does to such a file

It follows huggingface/transformers examples/tensorflow/language-modeling-tpu/prepare_tfrecord_shards.py:
`datasets.map(tokenize)` + `map(group_texts)` + a `tf.train.Example` of input_ids and attention_mask per
record into `tf.io.TFRecordWriter`, files named `<split dir>/dataset-{shard_count}-{records_containing}.tfrecord`
(num_proc=1 here, where the script uses 4: a 2-core CI machine). Used to test bringing such shards.
"""

import os

MAX_LENGTH = 64


def write_like_prepare_tfrecord_shards(rows, tokenizer_dir, split_dir, shard_size=300, max_length=MAX_LENGTH):
    import datasets
    import tensorflow as tf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def tokenize_fn(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        concatenated_examples = {k: sum(examples[k], []) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        total_length = (total_length // max_length) * max_length
        return {
            k: [t[i : i + max_length] for i in range(0, total_length, max_length)]
            for k, t in concatenated_examples.items()
        }

    def get_serialized_examples(tokenized_data):
        records = []
        for i in range(len(tokenized_data["input_ids"])):
            features = {
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=tokenized_data["input_ids"][i])),
                "attention_mask": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=tokenized_data["attention_mask"][i])
                ),
            }
            example = tf.train.Example(features=tf.train.Features(feature=features))
            records.append(example.SerializeToString())
        return records

    os.makedirs(split_dir, exist_ok=True)
    dataset = datasets.Dataset.from_dict({"text": rows})
    dataset_tokenized = dataset.map(tokenize_fn, batched=True, num_proc=1, remove_columns=["text"])
    grouped_dataset = dataset_tokenized.map(group_texts, batched=True, batch_size=1000, num_proc=1)
    shard_count, total = 0, 0
    for shard in range(0, len(grouped_dataset), shard_size):
        dataset_snapshot = grouped_dataset[shard : shard + shard_size]
        records_containing = len(dataset_snapshot["input_ids"])
        filename = os.path.join(split_dir, f"dataset-{shard_count}-{records_containing}.tfrecord")
        with tf.io.TFRecordWriter(filename) as out_file:
            for example in get_serialized_examples(dataset_snapshot):
                out_file.write(example)
        shard_count += 1
        total += records_containing
    return total


def damage_second_record(path, how: str) -> int:
    """Damage the second record of a TFRecord file of equal-sized records, as a bad copy or disk does:
    "data" flips a byte of its data, "length" one of its length field, "truncated" cuts the file inside
    it, "huge" gives it a length of 2**60 with a valid checksum. Returns the record's byte offset."""
    import struct
    from pathlib import Path

    from mlm_tasks.data.tfrecord import masked_crc32c

    path = Path(path)
    data = bytearray(path.read_bytes())
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    offset = 12 + length + 4
    if how == "data":
        data[offset + 12 + length // 2] ^= 0x01
    elif how == "length":
        data[offset + 1] ^= 0x01
    elif how == "truncated":
        del data[offset + 20 :]
    elif how == "huge":
        field = struct.pack("<Q", 2**60)
        data[offset : offset + 12] = field + struct.pack("<I", masked_crc32c(field))
    else:
        raise ValueError(f"unknown damage {how!r}")
    path.write_bytes(bytes(data))
    return offset
