"""The hand-rolled TFRecord writer (mlm_tasks/data/tfrecord.py) against TensorFlow's own writer and reader.

pytest tests/mlm_tasks/data/test_shards_format.py
"""

import os

import numpy as np
import pytest

from mlm_tasks.config import ShardConfig
from mlm_tasks.data.tfrecord import encode_examples, frame_records, records_from_name
from mlm_tasks.data.writer import BlockWriter, Chunker, encoded_batches


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
    feature = {
        "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in row])),
        "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * len(row))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("length", [1, 8, 128, 300])
def test_examples_match_tensorflow_bytes(tf, length):
    rng = np.random.default_rng(length)
    block = rng.choice(EDGES, size=(5, length)).astype(np.int64)
    block[1] = rng.integers(0, 8000, size=length)  # a typical row of token ids
    block[2] = 5  # every value one byte
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
    chunker = Chunker(cfg.max_length)
    for _, batch, encodings in encoded_batches((("", r) for r in rows), tok, cfg.tokenize_batch_rows):
        writer.write(chunker.add(batch, encodings))
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


# --- the reader (iter_records): shards brought from elsewhere are untrusted input ------------------------


def _framed(tmp_path, damage=None):
    """A file of three 8-id records, damaged by `damage(bytearray)`; returns (path, one record's size)."""
    records = encode_examples(np.full((3, 8), 7))
    data = bytearray(frame_records(records))
    if damage:
        damage(data)
    path = tmp_path / "part.tfrecord"
    path.write_bytes(bytes(data))
    return path, 12 + len(records[0]) + 4


def _read_all(path):
    from mlm_tasks.data.tfrecord import iter_records

    with open(path, "rb") as f:
        return list(iter_records(f, str(path)))


def test_the_reader_reads_what_the_writer_wrote(tmp_path):
    path, size = _framed(tmp_path)
    assert _read_all(path) == [(i * size, r) for i, r in enumerate(encode_examples(np.full((3, 8), 7)))]


def _flip(at):
    def damage(data):
        data[at(len(data))] ^= 0x01

    return damage


@pytest.mark.parametrize(
    "damage, record, what",
    [
        (_flip(lambda n: n // 3 + 20), 1, r"has a wrong data checksum \(data CRC\)"),  # a byte of record 1's data
        (_flip(lambda n: n // 3 + 2), 1, r"has a wrong length checksum \(length CRC\)"),  # a byte of its length
        (
            lambda d: d.__delitem__(slice(-5, None)),
            2,
            r"is truncated: it needs \d+ more bytes, the file ends after \d+",
        ),
        (lambda d: d.__delitem__(slice(-72, None)), 2, r"is truncated: the file ends 5 bytes into its 12-byte header"),
    ],
)
def test_a_damaged_record_names_the_file_the_offset_and_what(tmp_path, damage, record, what):
    from mlm_tasks.errors import ConfigError

    path, size = _framed(tmp_path, damage)
    with pytest.raises(
        ConfigError,
        match=rf"part\.tfrecord: the TFRecord at byte {record * size} {what}\. .*copy "
        r"it again from its source",
    ):
        _read_all(path)


def test_a_length_of_2_to_the_60_is_refused_without_allocating(tmp_path):
    """A length field with a valid checksum claiming 2**60 bytes (TensorFlow's own reader crashes on it)."""
    import struct
    import tracemalloc

    from mlm_tasks.data.tfrecord import masked_crc32c
    from mlm_tasks.errors import ConfigError

    length = struct.pack("<Q", 2**60)
    path, size = _framed(tmp_path, lambda d: d.extend(length + struct.pack("<I", masked_crc32c(length)) + b"x" * 64))
    tracemalloc.start()
    try:
        with pytest.raises(
            ConfigError,
            match=rf"at byte {3 * size} claims {2**60} bytes of data, more than the whole "
            r"file \(\d+ bytes\) holds \(length beyond the file\)",
        ):
            _read_all(path)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_protobuf_fields_that_run_past_their_message_are_refused():
    from mlm_tasks.data.tfrecord import parse_example

    record = encode_examples(np.full((1, 8), 7))[0]
    with pytest.raises(ValueError, match="runs past the end"):
        parse_example(record[:-3])
