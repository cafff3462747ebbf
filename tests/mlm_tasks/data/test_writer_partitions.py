"""Partitioned shard writing: the merged manifest has one partition's counts, and the same ids."""

import collections
import os
import struct

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.config import build_config
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.dedup import dedup_in_process
from mlm_tasks.data.tfrecord import records_from_name
from mlm_tasks.data.writer import merge_partitions, partition_manifest_uri, write_partition
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import DataPaths, join


def _read_ids(path: str, max_length: int) -> list[list[int]]:
    """Ids of every record, parsed without TensorFlow: every header byte of our records is a whole varint,
    so decoding the record as varints ends with the packed ids."""
    with open(path, "rb") as f:
        data, out, pos = f.read(), [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        record, pos = data[pos + 12 : pos + 12 + length], pos + 16 + length
        values, v, shift = [], 0, 0
        for byte in record:
            v |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                values.append(v)
                v, shift = 0, 0
        out.append(values[-max_length:])
    return out


@pytest.fixture
def setup(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(200)]
    text = tmp_path / "rows.txt"
    text.write_text("\n".join(" ".join(rng.choice(words, size=rng.integers(1, 30))) for _ in range(900)) + "\n")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, **{w: i + 5 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    cfg = build_config(
        {
            "output_root": str(tmp_path / "out"),
            "corpus": {
                "source": "local_files",
                "local_paths": [str(text)],
                "validation_fraction": 0.2,
                "test_fraction": 0.1,
            },
            "tokenizer": {"vocab_size": 1000},
            "model": {"max_position_embeddings": 66},
            "train": {"max_predictions_per_seq": 8},
            "shards": {"max_length": 16, "records_per_shard": 40, "tokenize_batch_rows": 25},
        }
    )
    return cfg, tok


def _publish_tokenizer(paths: DataPaths, tok) -> None:
    storage.write_text(join(paths.tokenizer, "tokenizer.json"), tok.to_str())


def _dedup(cfg, paths: DataPaths, num_parts: int) -> None:
    """The stages before the writer (mlm_tasks/data/dedup), for this partition count."""
    dedup_in_process(cfg, paths, open_corpus(cfg.corpus), num_parts)


def test_merged_manifest_matches_one_partition(setup):
    cfg, tok = setup
    single, multi = DataPaths(cfg.output_root, "single"), DataPaths(cfg.output_root, "multi")
    for paths, n in ((single, 1), (multi, 3)):
        _publish_tokenizer(paths, tok)
        _dedup(cfg, paths, n)
    write_partition(cfg, single, 0, 1)
    one = merge_partitions(cfg, single, 1, {}).data
    parts = [write_partition(cfg, multi, p, 3) for p in (2, 0, 1)]  # any order
    assert sorted(p["part"] for p in parts) == [0, 1, 2]
    assert not storage.exists(multi.success)  # nothing is published before the merge
    merged = merge_partitions(cfg, multi, 3, {}).data
    assert storage.exists(multi.success) and storage.read_json(multi.manifest) == merged

    for split in ("train", "validation", "test"):
        a, b = one["splits"][split], merged["splits"][split]
        assert {k: a[k] for k in ("records", "tokens", "rows", "characters")} == {
            k: b[k] for k in ("records", "tokens", "rows", "characters")
        }
        assert sum(s["records"] for s in b["shards"]) == b["records"]
        ids_a = [i for s in a["shards"] for r in _read_ids(join(single.shards_dir, s["file"]), 16) for i in r]
        ids_b = [i for s in b["shards"] for r in _read_ids(join(multi.shards_dir, s["file"]), 16) for i in r]
        assert len(ids_a) == len(ids_b) == a["tokens"]
        # Only the < max_length ids dropped at the very end may differ.
        diff = (collections.Counter(ids_a) - collections.Counter(ids_b)).total()
        assert diff < 16
        for s in b["shards"]:
            assert os.path.getsize(join(multi.shards_dir, s["file"])) == s["bytes"]
            assert records_from_name(s["file"]) == s["records"]  # partition and index never read as the count


def test_partition_rerun_is_skipped_and_merge_needs_every_part(setup):
    cfg, tok = setup
    paths = DataPaths(cfg.output_root, "rerun")
    _publish_tokenizer(paths, tok)
    _dedup(cfg, paths, 2)
    first = write_partition(cfg, paths, 0, 2)
    marker = partition_manifest_uri(paths, 0, 2)
    mtime = os.path.getmtime(marker)
    assert write_partition(cfg, paths, 0, 2) == first and os.path.getmtime(marker) == mtime
    with pytest.raises(MissingArtifactError, match="Partition 1 of 2"):
        merge_partitions(cfg, paths, 2, {})
    with pytest.raises(ValueError, match="outside"):
        write_partition(cfg, paths, 2, 2)


@pytest.mark.slow  # three CLI processes, each importing TensorFlow: ~20 s: in make test, not in make test-fast
def test_cli_fan_out_by_hand_matches_build_shard_set(tmp_path, capsys):
    """plan_shards, write_shards per part (any order), merge_shards: the DAG's fan-out from the CLI.
    Same fingerprint, tokenizer reused, counts (articles included) equal to the one-process build_shard_set."""
    import json as _json

    from mlm_tasks import cli
    from mlm_tasks.steps import build_shard_set
    from peers.tiny_data import TINY_YAML, tiny_config

    single = build_shard_set(tiny_config(tmp_path / "single"))
    root = tmp_path / "fanout"
    base = ["--config", str(TINY_YAML), "--set", f"output_root={root}", "--set", "shards.partitions=3"]

    def run(*args):
        assert cli.main(list(args) + base) == 0
        return _json.loads(capsys.readouterr().out)

    plan = run("plan_shards")
    assert plan["fingerprint"] == single["fingerprint"] and not plan["cache_hit"]
    assert [(p["fingerprint"], p["part"], p["num_parts"]) for p in plan["partitions"]] == [
        (single["fingerprint"], part, 3) for part in (0, 1, 2)
    ]
    fp = ["--data-fingerprint", plan["fingerprint"]]
    for part in (2, 0, 1):
        assert run("scan_partition", "--part", str(part), *fp)["part"] == part
    assert [run("find_duplicates", "--bucket", str(b), *fp)["bucket"] for b in range(3)] == [0, 1, 2]
    assert run("cluster_duplicates", *fp)["rows"]
    assert run("train_tokenizer", *fp)["rows"]
    for part in (2, 0, 1):
        assert run("write_shards", "--part", str(part), *fp)["part"] == part
    assert run("write_shards", "--part", "1", *fp)["part"] == 1  # rerun: skipped, same answer
    merged = run("merge_shards", *fp)

    # The tokenizer's file hash is left out: Unigram training is not byte-reproducible across processes.
    def same(summary: dict) -> dict:
        return {**summary["corpus"], "tokenizer": {**summary["corpus"]["tokenizer"], "sha256": None}}

    for key in ("records", "tokens", "vocab_size"):
        assert merged[key] == single[key], key
    assert same(merged) == same(single)
    manifest = storage.read_json(merged["manifest_uri"])
    assert manifest["partitions"] == 3 and storage.exists(merged["success_uri"])
    assert merged["written_here"] and not merged["cache_hit"]
    again = run("plan_shards")  # complete: nothing left to write
    assert again["cache_hit"] and again["partitions"] == [] and again["fingerprint"] == plan["fingerprint"]


def test_merge_of_an_empty_plan_names_a_set_deleted_since_the_plan(tmp_path):
    """An empty plan (the set was complete, or brought as it is) has the merge read the set: one deleted
    between the plan and the merge is named, not rebuilt from partitions nobody wrote, and not retried
    (a retry reads the same plan): the message says to start a new run."""
    from mlm_tasks.errors import MissingArtifactError, NoRetryError
    from mlm_tasks.paths import RunContext
    from mlm_tasks.results import ShardPlan
    from mlm_tasks.steps.merge_shards import merge_shards
    from peers.tiny_data import tiny_config

    cfg = tiny_config(tmp_path / "out")
    plan = ShardPlan(fingerprint="0123456789abcdef", cache_hit=True, corpus_fingerprint=None, partitions=[])
    with pytest.raises(
        MissingArtifactError, match=r"was complete when plan_shards ran, but its _SUCCESS is gone"
    ) as err:
        merge_shards(cfg, RunContext.of(cfg, fingerprint=plan["fingerprint"]), plan=plan)
    assert isinstance(err.value, NoRetryError) and "start a new run" in str(err.value)
