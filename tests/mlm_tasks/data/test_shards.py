"""Shards: counts in the manifest, marker last, byte-identical reruns, cache hits, corruption caught."""

import hashlib
import os

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.config import ShardConfig
from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.data.tfrecord import records_from_name
from mlm_tasks.data.writer import Chunker, encoded_batches
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import DataPaths
from mlm_tasks.steps import build_shard_set


def chunk_rows(rows, tokenizer, cfg: ShardConfig) -> tuple[list[np.ndarray], Chunker]:
    """The writer's blocks of one stream of rows, and its chunker (rows, characters, tail)."""
    chunker = Chunker(cfg.max_length)
    batches = encoded_batches((("", r) for r in rows), tokenizer, cfg.tokenize_batch_rows)
    return [chunker.add(batch, encodings) for _, batch, encodings in batches], chunker


def test_chunk_stream_concatenates_and_drops_only_the_tail(tiny_prepared):
    from mlm_tasks.data.tokenizer import load_tokenizer

    _, data = tiny_prepared
    tok = load_tokenizer(data["tokenizer_uri"])
    rows = ["alpha beta gamma"] * 50
    blocks, chunker = chunk_rows(rows, tok, ShardConfig(max_length=16, tokenize_batch_rows=7))
    ids = np.concatenate(blocks)
    per_row = len(tok("alpha beta gamma")["input_ids"])
    assert ids.shape == (50 * per_row // 16, 16) and chunker.rows == 50
    assert ids[0, 0] == tok.cls_token_id  # every row keeps its <s> ... </s>


def test_chunks_hold_exactly_the_encode_batch_ids(tiny_prepared):
    """The writer encodes with the bare tokenizer's encode_batch_fast (no transformers import): the ids
    must be those the PreTrainedTokenizerFast every reader loads gives, in order."""
    from mlm_tasks.data.corpus import open_corpus
    from mlm_tasks.data.tokenizer import load_encoder, load_tokenizer

    cfg, data = tiny_prepared
    tok = load_tokenizer(data["tokenizer_uri"])
    rows = list(open_corpus(cfg.corpus).rows("train"))[:400]
    blocks, _ = chunk_rows(
        rows, load_encoder(data["tokenizer_uri"]), ShardConfig(max_length=32, tokenize_batch_rows=50)
    )
    expected = [i for ids in tok(rows)["input_ids"] for i in ids]
    got = np.concatenate(blocks).ravel().tolist()
    assert len(got) == len(expected) // 32 * 32 > 1000
    assert got == expected[: len(got)]


def test_manifest_counts_match_files(tiny_prepared):
    cfg, data = tiny_prepared
    paths = DataPaths(cfg.output_root, data["fingerprint"])
    shard_set = ShardSet.load(paths)
    assert storage.exists(paths.success)
    for split in ("train", "validation", "test"):
        assert shard_set.tokens(split) == shard_set.records(split) * 64
        assert sum(s["records"] for s in shard_set.shards(split)) == shard_set.records(split)
        # The names carry the counts (what Hugging Face's scripts read), equal to the manifest's.
        assert [records_from_name(u) for u in shard_set.shard_uris(split)] == [
            s["records"] for s in shard_set.shards(split)
        ]
        assert all(os.path.basename(u).startswith(f"{split}-p00000of00001-") for u in shard_set.shard_uris(split))
    assert shard_set.max_length == 64 and shard_set.vocab_size == 1000
    assert shard_set.data["features"] == ["input_ids", "attention_mask"]
    shard_set.verify("train")


def test_rerun_is_a_cache_hit_that_writes_nothing(tiny_prepared):
    cfg, data = tiny_prepared
    before = {p: os.stat(p).st_mtime_ns for p in _files(data["data_root"])}
    again = build_shard_set(cfg)
    assert again["cache_hit"] is True and again["fingerprint"] == data["fingerprint"]
    assert data["written_here"] is True and again["written_here"] is False  # the shard gate waits only then
    assert {p: os.stat(p).st_mtime_ns for p in _files(data["data_root"])} == before


def test_shards_are_byte_identical_with_the_same_tokenizer(tiny_prepared, tmp_path):
    """Rebuild the shard set from the same tokenizer: every byte (shards and manifest) is equal."""
    import shutil

    cfg, data = tiny_prepared
    other = cfg.model_copy(update={"output_root": str(tmp_path / "out")})
    src = DataPaths(cfg.output_root, data["fingerprint"])
    dst = DataPaths(other.output_root, data["fingerprint"])
    shutil.copytree(src.tokenizer, dst.tokenizer)
    rebuilt = build_shard_set(other)
    assert rebuilt["cache_hit"] is False
    assert _digests(src.shards_dir) == _digests(dst.shards_dir)


def test_corrupted_shard_is_detected(tiny_prepared, tmp_path):
    import shutil

    cfg, data = tiny_prepared
    paths = DataPaths(str(tmp_path), data["fingerprint"])
    shutil.copytree(data["data_root"], paths.root)
    shard_set = ShardSet.load(paths)
    first = shard_set.shard_uris("train")[0]
    with open(first, "r+b") as f:
        f.truncate(os.path.getsize(first) // 2)
    # A ConfigError: retrying cannot help, the message says what to delete and rerun.
    with pytest.raises(
        ConfigError,
        match=f"corrupted or truncated.*retrying cannot fix it: delete {paths.shards_dir} "
        f"and {paths.partitions_dir}, then rerun build_shard_set",
    ):
        shard_set.verify("train")


def test_damaged_manifest_says_what_to_delete(tiny_prepared, tmp_path):
    import shutil

    cfg, data = tiny_prepared
    paths = DataPaths(str(tmp_path), data["fingerprint"])
    shutil.copytree(data["data_root"], paths.root)
    text = storage.read_text(paths.manifest)
    storage.write_text(paths.manifest, text[: len(text) // 2])
    with pytest.raises(ConfigError, match=f"{paths.manifest} is damaged \\(JSONDecodeError.*delete {paths.shards_dir}"):
        ShardSet.load(paths)


def test_empty_corpus_fails_with_what_to_fix(tmp_path, tiny_cfg):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    cfg = tiny_cfg.model_copy(
        update={"corpus": tiny_cfg.corpus.model_copy(update={"source": "local_files", "local_paths": [str(empty)]})}
    )
    with pytest.raises(ConfigError, match="corpus is empty"):
        build_shard_set(cfg)
    assert not list(tmp_path.glob("out/datasets/*/shards/_SUCCESS"))


def test_corpus_shorter_than_one_chunk(tmp_path, tiny_cfg):
    import pyarrow as pa  # noqa: F401  (keeps the import cost in one place)

    text = tmp_path / "short.txt"
    # Enough distinct text for a 1000-piece tokenizer, but not for one 64-token validation chunk.
    text.write_text("\n".join(f"row {i} has words like w{i} and x{i * 7}" for i in range(400)))
    cfg = tiny_cfg.model_copy(
        update={
            "corpus": tiny_cfg.corpus.model_copy(
                update={
                    "source": "local_files",
                    "local_paths": [str(text)],
                    "validation_fraction": 0.0,
                    "test_fraction": 0.0,
                }
            )
        }
    )
    cfg.tokenizer.vocab_size = 300
    with pytest.raises(ConfigError, match="shorter than one chunk"):
        build_shard_set(cfg)


def _files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def _digests(root):
    return {os.path.relpath(p, root): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in _files(root)}


def test_flipped_byte_is_caught_by_the_checksum_only(tiny_prepared, tmp_path):
    import shutil

    cfg, data = tiny_prepared
    paths = DataPaths(str(tmp_path), data["fingerprint"])
    shutil.copytree(data["data_root"], paths.root)
    shard_set = ShardSet.load(paths)
    first = shard_set.shard_uris("train")[0]
    with open(first, "rb") as f:
        raw = bytearray(f.read())
    raw[len(raw) // 2] ^= 0x01
    with open(first, "wb") as f:
        f.write(bytes(raw))
    shard_set.verify("train", checksums=False)  # same size: the cheap check cannot see it
    with pytest.raises(ConfigError, match=r"corrupted or truncated \(sha256 "):
        shard_set.verify("train")
