"""The hand-rolled TFRecord writer (mlm_tasks/tfrecord.py) against TensorFlow's own writer and reader.

    pytest tests/mlm_tasks/test_shards_format.py
"""
import os

import numpy as np
import pytest

from mlm_tasks.config import ShardConfig
from mlm_tasks.shards import BlockWriter, chunk_stream, records_from_name
from mlm_tasks.tfrecord import encode_examples, frame_records



@pytest.fixture(scope="module")
def tf():
    # Imported here, not at collection, so the rest of the suite does not pay for TensorFlow.
    import tensorflow

    return tensorflow

# Every varint width from 1 to 5 bytes, and the edges between them.
EDGES = [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**31 - 1]


def _tf_example(tf, row) -> bytes:
    # As the Hugging Face preparation script builds it (input_ids + attention_mask); deterministic=True
    # fixes the map order (by key), which is the order ours writes.
    feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in row])),
               "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * len(row)))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("length", [1, 8, 128, 300])
def test_examples_match_tensorflow_bytes(tf, length):
    rng = np.random.default_rng(length)
    block = rng.choice(EDGES, size=(5, length)).astype(np.int64)
    block[1] = rng.integers(0, 8000, size=length)  # a typical row of token ids
    block[2] = 5                                   # every value one byte
    ours = encode_examples(block)
    assert ours == [_tf_example(tf, row) for row in block]


def test_framing_matches_tfrecordwriter(tf, tmp_path):
    block = np.random.default_rng(0).integers(0, 50_000, size=(7, 128))
    records = encode_examples(block)
    ref = tmp_path / "ref.tfrecord"
    with tf.io.TFRecordWriter(str(ref)) as writer:
        for record in records:
            writer.write(record)
    assert frame_records(records) == ref.read_bytes()
    assert frame_records([]) == b""


def test_negative_ids_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        encode_examples(np.array([[1, -1]]))


def _word_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return tok, vocab


def test_written_blocks_read_back_with_tf_data(tf, tmp_path):
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(300)]
    rows = [" ".join(rng.choice(words, size=rng.integers(1, 40))) for _ in range(200)]
    tok, vocab = _word_tokenizer(words)
    cfg = ShardConfig(max_length=16, records_per_shard=50, tokenize_batch_rows=7)
    writer = BlockWriter(str(tmp_path), "train", "train-p00000of00001", cfg)
    for block in chunk_stream(iter(rows), tok, cfg, {}):
        writer.write(block)
    shards = writer.finish()
    entry = {"records": sum(s["records"] for s in shards), "shards": shards}
    entry["tokens"] = entry["records"] * 16

    expected = np.array([i for r in rows for i in [0] + [vocab[w] for w in r.split()] + [2]])
    expected = expected[: len(expected) // 16 * 16].reshape(-1, 16)
    assert entry["records"] == len(expected) and entry["tokens"] == expected.size
    assert [s["records"] for s in entry["shards"]][:-1] == [50] * (len(entry["shards"]) - 1)
    assert sum(s["records"] for s in entry["shards"]) == len(expected)

    files = [os.path.join(tmp_path, s["file"]) for s in entry["shards"]]
    assert [records_from_name(f) for f in files] == [s["records"] for s in entry["shards"]]
    feature = {k: tf.io.FixedLenFeature([16], tf.int64) for k in ("input_ids", "attention_mask")}
    ds = tf.data.TFRecordDataset(files).batch(1000).map(lambda x: tf.io.parse_example(x, feature))
    got = list(ds)
    np.testing.assert_array_equal(np.concatenate([b["input_ids"].numpy() for b in got]), expected)
    assert all(b["attention_mask"].numpy().all() for b in got)
