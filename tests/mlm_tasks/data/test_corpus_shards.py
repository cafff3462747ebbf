"""Bring your own shards: shards written the way Hugging Face's prepare_tfrecord_shards.py writes them
are validated, adopted (fingerprint, counts from names or counted once) and trained on through the CLI.

The shards are written by tests/peers/seed_shards.py, which follows huggingface/transformers
examples/tensorflow/language-modeling-tpu/prepare_tfrecord_shards.py: `datasets.map(tokenize)` +
`map(group_texts)` + a `tf.train.Example` of input_ids and attention_mask per record into
`tf.io.TFRecordWriter`, files named `<split>/dataset-{shard_count}-{records_containing}.tfrecord`.

    pytest tests/mlm_tasks/data/test_corpus_shards.py
"""

import json
import os
import re
import shutil

import numpy as np
import pytest

from mlm_tasks.data.shard_set import ShardSet
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import DataPaths
from peers.seed_shards import MAX_LENGTH, damage_second_record, write_like_prepare_tfrecord_shards
from peers.tiny_data import TINY_YAML, tiny_config


@pytest.fixture(scope="module")
def seed_shards(tiny_prepared, tmp_path_factory):
    """train/ and validation/ shards of the tiny corpus, written as the seed script writes them, and
    the tokenizer folder they were encoded with. Returns (shards folder, tokenizer folder, records)."""
    from mlm_tasks.data.corpus import open_corpus

    cfg, data = tiny_prepared
    root = tmp_path_factory.mktemp("byo")
    tok_dir = root / "tokenizer"
    shutil.copytree(data["tokenizer_uri"], tok_dir)
    corpus = open_corpus(cfg.corpus)
    records = {
        split: write_like_prepare_tfrecord_shards(list(corpus.rows(split)), str(tok_dir), str(root / "shards" / split))
        for split in ("train", "validation")
    }
    return root / "shards", tok_dir, records


def byo_config(out, shards, tok, **more):
    return tiny_config(
        out,
        **{
            "corpus.source": "tfrecord_shards",
            "corpus.shards_uri": str(shards),
            "corpus.tokenizer_uri": str(tok),
            **more,
        },
    )


def _cli(capsys, *args) -> dict:
    from mlm_tasks import cli

    assert cli.main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _set(out, shards, tok, *more):
    args = [
        "--config",
        str(TINY_YAML),
        "--set",
        f"output_root={out}",
        "--set",
        "corpus.source=tfrecord_shards",
        "--set",
        f"corpus.shards_uri={shards}",
        "--set",
        f"corpus.tokenizer_uri={tok}",
    ]
    for m in more:
        args += ["--set", m]
    return args


@pytest.mark.slow  # a training run through the CLI
def test_trains_through_the_cli_on_shards_written_by_the_seed_script(seed_shards, tmp_path, capsys):
    shards, tok, records = seed_shards
    out = tmp_path / "out"
    _cli(capsys, "validate", *_set(out, shards, tok))
    result = _cli(capsys, "run_all", "--run-id", "byo", *_set(out, shards, tok, "train.steps=4"))
    data = result["data"]
    # Counts from the names ("dataset-0-300.tfrecord"), equal to what was written; nothing tokenized here.
    assert data["records"] == {"train": records["train"], "validation": records["validation"], "test": 0}
    assert data["corpus"]["source"] == "tfrecord_shards" and data["cache_hit"] is False
    assert result["train"]["steps"] == 4 and result["evaluate"]["masked_tokens"] > 0
    shard_set = ShardSet.load(DataPaths(str(out), data["fingerprint"]))
    assert all(u.startswith(str(shards)) for u in shard_set.shard_uris("train"))  # read in place, not copied
    assert not os.path.exists(DataPaths(str(out), data["fingerprint"]).shards("train"))

    # Same files: the same fingerprint, adopted already. A file touched: a new fingerprint.
    again = _cli(capsys, "build_shard_set", *_set(out, shards, tok))
    assert again["fingerprint"] == data["fingerprint"] and again["cache_hit"] is True
    first = sorted((shards / "train").glob("*.tfrecord"))[0]
    stat = first.stat()
    try:
        os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert _cli(capsys, "fingerprint", *_set(out, shards, tok)) != data["fingerprint"]
    finally:
        os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_names_without_counts_are_counted_once(seed_shards, tmp_path, monkeypatch):
    from mlm_tasks.data.corpus import shards as byo_shards
    from mlm_tasks.steps import build_shard_set

    shards, tok, records = seed_shards
    renamed = tmp_path / "renamed"
    for split in ("train", "validation"):
        (renamed / split).mkdir(parents=True)
        for i, f in enumerate(sorted((shards / split).glob("*.tfrecord"))):
            shutil.copy(f, renamed / split / f"part{i}.tfrecord")
    calls = []
    real = byo_shards.count_records
    monkeypatch.setattr(byo_shards, "count_records", lambda f, name: calls.append(1) or real(f, name))
    cfg = byo_config(tmp_path / "out", renamed, tok)
    first = build_shard_set(cfg)
    assert (
        first["records"]["train"] == records["train"]
        and len(calls) == first["shards"]["train"] + first["shards"]["validation"]
    )
    assert (
        build_shard_set(cfg) == {**first, "cache_hit": True}
        and len(calls) == first["shards"]["train"] + first["shards"]["validation"]
    )  # the manifest is the cache: not counted again


def _craft(folder, block, features=("input_ids", "attention_mask")):
    import tensorflow as tf

    (folder / "train").mkdir(parents=True, exist_ok=True)
    (folder / "validation").mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):
        with tf.io.TFRecordWriter(str(folder / split / f"dataset-0-{len(block)}.tfrecord")) as w:
            for row in block:
                values = {"input_ids": row, "attention_mask": np.ones_like(row)}
                feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=values[k])) for k in features}
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.mark.parametrize(
    "case, block, features, expect",
    [
        (
            "no attention_mask",
            np.full((4, MAX_LENGTH), 7),
            ("input_ids",),
            r"feature 'attention_mask' is absent, not an int64 list: these shards need input_ids and attention_mask",
        ),
        (
            "other length",
            np.full((4, 32), 7),
            ("input_ids", "attention_mask"),
            r"hold 32-token records but shards\.max_length is 64: set shards\.max_length=32",
        ),
        (
            "ids beyond the vocabulary",
            np.full((4, MAX_LENGTH), 5000),
            ("input_ids", "attention_mask"),
            r"token id 5000 is outside the vocabulary of .* \(1000 tokens\): these shards were encoded with another "
            r"tokenizer",
        ),
    ],
)
def test_bad_shards_are_refused_before_anything_runs(seed_shards, tmp_path, case, block, features, expect):
    from mlm_tasks.steps.validate import validate

    _, tok, _ = seed_shards
    _craft(tmp_path / "bad", block, features)
    with pytest.raises(ConfigError, match=expect):
        validate(byo_config(tmp_path / "out", tmp_path / "bad", tok))


@pytest.mark.parametrize(
    "how, what",
    [
        ("data", r"has a wrong data checksum \(data CRC\)"),
        ("length", r"has a wrong length checksum \(length CRC\)"),
        ("truncated", r"is truncated: it needs \d+ more bytes, the file ends after 8"),
        (
            "huge",
            rf"claims {2**60} bytes of data, more than the whole file \(\d+ bytes\) holds "
            r"\(length beyond the file\)",
        ),
    ],
)
def test_damaged_records_are_refused_by_validate_naming_file_and_offset(seed_shards, tmp_path, how, what):
    from mlm_tasks.steps.validate import validate

    _, tok, _ = seed_shards
    _craft(tmp_path / "bad", np.full((4, MAX_LENGTH), 7))
    shard = tmp_path / "bad" / "validation" / "dataset-0-4.tfrecord"
    offset = damage_second_record(shard, how)
    with pytest.raises(ConfigError, match=rf"{shard}: the TFRecord at byte {offset} {what}\. .*copy it again"):
        validate(byo_config(tmp_path / "out", tmp_path / "bad", tok))


def test_adoption_checks_every_record_and_the_count_in_the_name(seed_shards, tmp_path):
    """validate reads the first records of a few shards; adoption reads all of them: a damaged record past
    the sample, or a file cut at a record boundary (every checksum fine), is refused before training."""
    from mlm_tasks.data.corpus import shards as byo_shards
    from mlm_tasks.steps import build_shard_set

    _, tok, _ = seed_shards
    _craft(tmp_path / "bad", np.full((4, MAX_LENGTH), 7))
    shard = tmp_path / "bad" / "train" / "dataset-0-4.tfrecord"
    whole = shard.read_bytes()
    cfg = byo_config(tmp_path / "out", tmp_path / "bad", tok)
    offset = damage_second_record(shard, "data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(byo_shards, "SAMPLE_RECORDS", 1)  # the damaged record is past validate's sample
        with pytest.raises(ConfigError, match=rf"{shard}: the TFRecord at byte {offset} has a wrong data checksum"):
            build_shard_set(cfg)
    shard.write_bytes(whole[:offset])
    with pytest.raises(
        ConfigError,
        match=rf"{shard} holds 1 whole records but its name says 4: the file was cut "
        r"short \(at a record boundary\) or renamed",
    ):
        build_shard_set(cfg)


def test_training_on_a_shard_damaged_after_adoption_exits_2(seed_shards, tmp_path, capsys):
    """TensorFlow's reader checks the checksums itself; its DataLossError names no file. The train step
    names it, as a ConfigError: the CLI exits 2 (the Airflow task fails without retries)."""
    from mlm_tasks import cli

    shards, tok, _ = seed_shards
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    out = tmp_path / "out"
    fp = _cli(capsys, "build_shard_set", *_set(out, copy, tok))["fingerprint"]
    damaged = sorted((copy / "train").glob("*.tfrecord"))
    for shard in damaged:  # the first record of each: read before the first batch, whatever the file order
        data = bytearray(shard.read_bytes())
        data[40] ^= 0x01
        shard.write_bytes(bytes(data))
    code = cli.main(["train", "--run-id", "damaged", "--data-fingerprint", fp, *_set(out, copy, tok, "train.steps=2")])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert re.search(
        rf"error: Training read a damaged train shard \(TensorFlow: corrupted record at 12\)\. "
        rf"{damaged[0]}: the TFRecord at byte 0 has a wrong data checksum \(data CRC\)\..*Retrying "
        r"cannot fix it",
        err,
    ), err[-3000:]


def test_a_tokenizer_that_is_nowhere_is_named(seed_shards, tmp_path, fake_hub):
    """A local folder, a gs:// folder or a Hub repo id (owner/name, read from the fake Hub): anything else
    says so."""
    from huggingface_hub import HfApi

    from mlm_tasks.base_model import BaseModelRef

    def fetch_tokenizer_json(uri: str) -> str:  # what ShardsCorpus.tokenizer_json reads
        return BaseModelRef(uri, setting="corpus.tokenizer_uri").tokenizer_json()

    _, tok, _ = seed_shards
    api = HfApi(endpoint=fake_hub.url, token=fake_hub.token)
    api.create_repo("tester/shards-tokenizer")
    api.upload_folder(repo_id="tester/shards-tokenizer", folder_path=str(tok))
    assert fetch_tokenizer_json("tester/shards-tokenizer") == (tok / "tokenizer.json").read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match="The Hub has no model repo tester/nothing-here .corpus.tokenizer_uri."):
        fetch_tokenizer_json("tester/nothing-here")

    with pytest.raises(ConfigError, match="is neither an existing local folder, a gs:// folder, nor a Hub repo id"):
        fetch_tokenizer_json(str(tmp_path / "no" / "such" / "folder"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        fetch_tokenizer_json(str(tmp_path / "empty"))


def test_shards_under_a_gs_prefix(seed_shards, gcs_root, tmp_path):
    """The same set uploaded to a bucket: listed with generations, adopted, sizes verified."""
    from mlm_tasks import storage
    from mlm_tasks.steps import build_shard_set

    shards, tok, records = seed_shards
    for split in ("train", "validation"):
        for f in (shards / split).glob("*.tfrecord"):
            storage.write_bytes(f"{gcs_root}/shards/{split}/{f.name}", f.read_bytes())
    storage.upload_dir(str(tok), f"{gcs_root}/tok")
    cfg = byo_config(tmp_path / "out", f"{gcs_root}/shards", f"{gcs_root}/tok")
    data = build_shard_set(cfg)
    assert data["records"]["train"] == records["train"]
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    assert all(u.startswith(f"{gcs_root}/shards/train/") for u in shard_set.shard_uris("train"))
    assert all(s["version"] not in ("None", "") for s in shard_set.shards("train"))
    shard_set.verify("train")
