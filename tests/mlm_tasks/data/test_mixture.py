"""A mixture of two sources (corpus.source: mixture): shards and counts by source, the fingerprint without the
weights, training input drawn by weight, and the settings a mixture refuses.

The two sources are local .txt files of different text: rows of the embedded Wikipedia sample, and rows of a
synthetic vocabulary (made-up words), so a record's source is known from its ids.

    pytest tests/mlm_tasks/data/test_mixture.py
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mlm_tasks.config import CorpusConfig, build_config
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.shard_set import ShardSet, data_fingerprint, source_weights
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS, DataPaths

HF_RECORDS = re.compile(r"-\d+-(\d+)\.tfrecord")  # run_mlm.py's count_samples (language-modeling-tpu)


def mixture_config(root, wiki_weight=1.0, synth_weight=3.0, **shards):
    return build_config(
        {
            "output_root": str(root / "out"),
            "corpus": {
                "source": "mixture",
                "validation_fraction": 0.2,
                "test_fraction": 0.1,
                "mixture": [
                    {"name": "wiki", "local_paths": [str(root / "wiki.txt")], "weight": wiki_weight},
                    {"name": "synth", "local_paths": [str(root / "synth.txt")], "weight": synth_weight},
                ],
            },
            "tokenizer": {"vocab_size": 600},
            "model": {"max_position_embeddings": 66},
            "train": {"max_predictions_per_seq": 8},
            "shards": {"max_length": 32, "records_per_shard": 32, **shards},
        }
    )


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    """(config, data summary) of a built two-source mixture: wiki 1, synth 3."""
    from mlm_tasks.steps import build_shard_set

    root = tmp_path_factory.mktemp("mixture")
    wiki = [row for _, row in open_corpus(CorpusConfig(max_articles=3)).split_rows()]
    (root / "wiki.txt").write_text("\n\n\n".join(wiki) + "\n")  # blank lines (skipped) spread the rows

    rng = np.random.default_rng(0)
    syllables = ["zo", "qu", "ix", "ra", "mu", "ke", "vy", "lo", "pa", "fe"]
    words = ["".join(rng.choice(syllables, size=rng.integers(2, 4))) for _ in range(60)]
    synth = [" ".join(rng.choice(words, size=rng.integers(6, 16))) + "." for _ in range(500)]
    (root / "synth.txt").write_text("\n\n\n".join(synth) + "\n")  # over several partitions
    cfg = mixture_config(root)
    return cfg, build_shard_set(cfg)


def test_counts_by_source_add_up(mixture):
    cfg, data = mixture
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    assert shard_set.data["corpus_source"] == "mixture"
    assert [m["name"] for m in shard_set.data["mixture"]] == ["synth", "wiki"]
    sources = data["corpus"]["sources"]
    assert {n: s["weight"] for n, s in sources.items()} == {"synth": 3.0, "wiki": 1.0}
    for split in SPLITS:
        entry = shard_set.entry(split)
        for key in ("records", "tokens", "rows", "characters"):
            assert sum(s[key] for s in entry["sources"].values()) == entry[key], (split, key)
            assert sum(s[key][split] for s in sources.values()) == entry[key], (split, key)
        assert sum(s["shards"] for s in entry["sources"].values()) == len(entry["shards"])
        by_source = shard_set.source_shard_uris(split)
        for name, counts in entry["sources"].items():
            shards = [s for s in entry["shards"] if s["source"] == name]
            assert len(by_source[name]) == len(shards) == counts["shards"]
            assert sum(s["records"] for s in shards) == counts["records"]
            assert all(s["file"].startswith(f"{split}/{split}-{name}-") for s in shards)
        # Hugging Face's regex reads every new name's record count, and they add up to the split's.
        names = [s["file"].rsplit("/", 1)[-1] for s in entry["shards"]]
        assert sum(int(HF_RECORDS.search(n).group(1)) for n in names) == entry["records"]
        assert len(set(names)) == len(names)
    assert all(sources[n]["records"]["train"] > 0 for n in sources)
    assert data["records"]["train"] == shard_set.records("train")


def test_the_report_and_the_card_show_each_sources_weight_and_tokens(mixture):
    from mlm_tasks.reporting.card import render_model_card
    from mlm_tasks.reporting.report import data_lines

    cfg, data = mixture
    card = render_model_card(cfg, "run-1", {"data_info": data})
    report = "\n".join(data_lines(cfg, data))
    for name, weight in (("synth", 3), ("wiki", 1)):
        tokens = data["corpus"]["sources"][name]["tokens"]
        line = (
            f"- Source `{name}`, weight {weight}: tokens train {tokens['train']:,}, validation {tokens['validation']:,}"
        )
        assert line in card and line in report


def test_only_weights_changed_reuses_the_set(mixture):
    from mlm_tasks.steps import build_shard_set

    cfg, data = mixture
    root = Path(cfg.corpus.mixture[0].local_paths[0]).parent
    reweighted = mixture_config(root, wiki_weight=5.0, synth_weight=0.5)
    reordered = reweighted.model_copy(deep=True)
    reordered.corpus.mixture = list(reversed(reordered.corpus.mixture))  # the order of the list changes nothing
    assert data_fingerprint(reweighted) == data_fingerprint(reordered) == data["fingerprint"]
    again = build_shard_set(reweighted)
    assert again["cache_hit"] and again["fingerprint"] == data["fingerprint"]
    assert {n: s["weight"] for n, s in again["corpus"]["sources"].items()} == {"synth": 0.5, "wiki": 5.0}
    renamed = json.loads(json.dumps(cfg.model_dump(mode="json")).replace('"synth"', '"made_up"'))
    assert data_fingerprint(build_config(renamed)) != data["fingerprint"]  # a name labels shards: new set
    by_file = cfg.model_dump(mode="json")
    by_file["corpus"]["mixture"][1]["split_by"] = "file"  # a source's own split setting: other rows per split
    assert data_fingerprint(build_config(by_file)) != data["fingerprint"]


def test_plan_sizes_partitions_by_all_sources(mixture):
    from mlm_tasks.config import ShardConfig
    from mlm_tasks.steps.plan_shards import partition_count

    cfg, _ = mixture
    corpus = open_corpus(cfg.corpus)
    sizes = [Path(p).stat().st_size for s in cfg.corpus.mixture for p in s.local_paths]
    assert corpus.size_bytes() == sum(sizes)
    assert partition_count(ShardConfig(partitions=1, partition_mb=1), corpus) == 1  # well under 1 MiB


def test_partitions_write_the_same_counts_by_source(mixture, tmp_path):
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps import prepare_partitions
    from mlm_tasks.steps.merge_shards import merge_shards
    from mlm_tasks.steps.plan_shards import plan_shards
    from mlm_tasks.steps.write_shards import write_shards

    cfg, data = mixture
    cfg3 = cfg.model_copy(update={"output_root": str(tmp_path / "three")})
    ctx = RunContext.of(cfg3)
    plan = plan_shards(cfg3, ctx, num_parts=3)
    ctx = ctx.with_data(plan["fingerprint"])
    prepare_partitions(cfg3, ctx, plan)
    for p in plan["partitions"]:
        write_shards(cfg3, ctx, part=p["part"], num_parts=3)
    three = merge_shards(cfg3, ctx, plan=plan)
    assert three["fingerprint"] == data["fingerprint"]
    for key in ("records", "tokens", "rows", "characters"):
        assert {n: s[key] for n, s in three["corpus"]["sources"].items()} == {
            n: s[key] for n, s in data["corpus"]["sources"].items()
        }
    for split in SPLITS:
        names = [s["file"].rsplit("/", 1)[-1] for s in ShardSet.load(ctx.data).shards(split)]
        assert len(set(names)) == len(names)
        assert sum(int(HF_RECORDS.search(n).group(1)) for n in names) == three["records"][split]


def _records_by_source(shard_set: ShardSet, split: str) -> dict[tuple, str]:
    import tensorflow as tf

    feature = {"input_ids": tf.io.FixedLenFeature([shard_set.max_length], tf.int64)}
    found = {}
    for name, uris in shard_set.source_shard_uris(split).items():
        for record in tf.data.TFRecordDataset(uris):
            found[tuple(tf.io.parse_single_example(record, feature)["input_ids"].numpy().tolist())] = name
    return found


def test_train_input_draws_by_weight(mixture):
    from mlm_tasks.data.input import mlm_dataset
    from mlm_tasks.data.tokenizer import load_tokenizer

    cfg, data = mixture
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    owner = _records_by_source(shard_set, "train")
    weights = source_weights(cfg, shard_set)
    assert weights == {"synth": 3.0, "wiki": 1.0}
    ds = mlm_dataset(shard_set, "train", tokenizer, 16, seed=5, shuffle_buffer=64, take_batches=60, weights=weights)
    drawn = {"synth": 0, "wiki": 0}
    for batch in ds.as_numpy_iterator():
        original = np.where(batch["labels"] == -100, batch["input_ids"], batch["labels"])  # undo the masking
        for ids in original.tolist():
            drawn[owner[tuple(ids)]] += 1
    natural = data["corpus"]["sources"]["synth"]["records"]["train"] / data["records"]["train"]
    share = drawn["synth"] / sum(drawn.values())
    assert natural < 0.4  # synth is the smaller source: 3:1 up-samples it ...
    assert abs(share - 0.75) < 0.05, drawn  # ... to about 3 in 4 of 960 examples (binomial sd 0.014)
    assert drawn["synth"] > data["corpus"]["sources"]["synth"]["records"]["train"]  # its records repeat

    validation = mlm_dataset(shard_set, "validation", tokenizer, 16, training=False, weights=weights)
    read = sum(len(batch["input_ids"]) for batch in validation.as_numpy_iterator())
    assert read == shard_set.records("validation")  # evaluation stays one pass over every record


@pytest.mark.parametrize(
    "corpus, says",
    [
        ({"source": "mixture", "mixture": [{"name": "a"}, {"name": "a"}]}, "repeats the name"),
        ({"source": "mixture", "mixture": [{"name": "a", "weight": 0}]}, "greater than 0"),
        ({"source": "mixture", "mixture": [{"name": "a", "weight": 101}]}, "less than or equal to 100"),
        ({"source": "mixture", "mixture": [{"name": "a", "source": "mixture"}]}, "holds no mixture"),
        ({"source": "mixture", "mixture": [{"name": "a", "source": "tfrecord_shards"}]}, "cannot be mixed"),
        ({"source": "mixture", "mixture": [{"name": "Web"}]}, "corpus.mixture.0.name"),
        ({"source": "mixture"}, "needs corpus.mixture"),
        ({"mixture": [{"name": "a"}]}, "set corpus.source: mixture"),
        ({"source": "mixture", "dump_path": "x.bz2", "mixture": [{"name": "a"}]}, "not corpus.dump_path"),
    ],
)
def test_bad_mixtures_are_config_errors(corpus, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        build_config({"corpus": corpus})


def test_weights_name_exactly_the_sets_sources(mixture):
    cfg, data = mixture
    shard_set = ShardSet.load(DataPaths(cfg.output_root, data["fingerprint"]))
    missing = cfg.model_copy(deep=True)
    missing.corpus.mixture = [s for s in missing.corpus.mixture if s.name == "wiki"]
    with pytest.raises(ConfigError, match=r"holds the sources \['synth', 'wiki'\].*names \['wiki'\]"):
        source_weights(missing, shard_set)
    extra = cfg.model_copy(deep=True)
    extra.corpus.mixture = [*extra.corpus.mixture, extra.corpus.mixture[0].model_copy(update={"name": "more"})]
    with pytest.raises(ConfigError, match=r"names \['wiki', 'synth', 'more'\]"):
        source_weights(extra, shard_set)
    single = build_config({"output_root": cfg.output_root})
    with pytest.raises(ConfigError, match=r"names \(none\)"):
        source_weights(single, shard_set)


def test_validate_reads_each_local_source(mixture, tmp_path):
    from mlm_tasks.steps.validate import validate

    cfg, _ = mixture
    assert validate(cfg)["corpus"]["source"] == "mixture"
    (tmp_path / "blank.txt").write_text("\n\n")
    tree = cfg.model_dump(mode="json")
    tree["corpus"]["mixture"][1]["local_paths"] = [str(tmp_path / "blank.txt")]
    with pytest.raises(ConfigError, match=r"corpus\.mixture source 'synth': The corpus is empty"):
        validate(build_config(tree))


def test_check_run_and_the_train_step_input_take_the_weights(mixture):
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps.check_run import check_run
    from mlm_tasks.training.step import train_input

    cfg, data = mixture
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"batch_size": 8})})
    ctx = RunContext.of(cfg, "mixture-run", data["fingerprint"])
    assert check_run(cfg, ctx, data=data)["train_records"] == data["records"]["train"]  # an epoch: every record
    shard_set = ShardSet.load(ctx.data)
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    batches = list(train_input(cfg, shard_set, tokenizer, 8, skip=0, take=3)(None).as_numpy_iterator())
    assert [b["input_ids"].shape for b in batches] == [(8, 32)] * 3
    missing = cfg.model_copy(deep=True)
    missing.corpus.mixture = missing.corpus.mixture[:1]
    with pytest.raises(ConfigError, match="weights are matched by name"):
        check_run(missing, ctx, data=data)
