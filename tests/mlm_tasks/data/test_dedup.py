"""Deduplication (mlm_tasks/data/dedup): exact copies written once, planted near-duplicates found at a
stated precision and recall, the tokenizer's sample bounded and the same for any partition count."""

import random
import re
import shutil

import numpy as np
import pytest

from mlm_tasks import storage
from mlm_tasks.config import CorpusConfig, build_config
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.dedup import dedup_in_process
from mlm_tasks.data.dedup.matches import pairs_in
from mlm_tasks.data.dedup.scan import KEY_DTYPE, parts_and_indexes, row_id, split_ranks
from mlm_tasks.errors import ConfigError
from mlm_tasks.paths import SPLITS, DataPaths, RunContext


def _wiki_paragraphs(n: int, min_words: int) -> list[str]:
    """Distinct paragraphs of the embedded Wikipedia sample, at least `min_words` long."""
    seen, out = set(), []
    for _, row in open_corpus(CorpusConfig()).split_rows():
        if len(row.split()) >= min_words and row not in seen:
            seen.add(row)
            out.append(row)
            if len(out) == n:
                break
    return out


def _config(tmp_path, lines: list[str], name: str, **sections):
    path = tmp_path / f"{name}.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return build_config(
        {
            "output_root": str(tmp_path / name / "out"),
            # The filters are test_filters.py's: here every row reaches the dedup.
            "corpus": {
                "source": "local_files",
                "local_paths": [str(path)],
                "validation_fraction": 0.1,
                "filters": {"enabled": False},
            },
            "tokenizer": {"vocab_size": 1000},
            "model": {"max_position_embeddings": 66},
            "train": {"max_predictions_per_seq": 10},
            "shards": {"max_length": 64, "records_per_shard": 50},
            **sections,
        }
    )


def _build(cfg, partitions: int = 1, tokenizer_from=None):
    """Every shard-set step in this process; the tokenizer copied from `tokenizer_from` when given
    (Unigram training is not id-reproducible, so comparing shards needs one tokenizer)."""
    from mlm_tasks.steps import prepare_partitions
    from mlm_tasks.steps.merge_shards import merge_shards
    from mlm_tasks.steps.plan_shards import plan_shards
    from mlm_tasks.steps.write_shards import write_shards

    plan = plan_shards(cfg, RunContext.of(cfg), num_parts=partitions)
    ctx = RunContext.of(cfg, fingerprint=plan["fingerprint"])
    if tokenizer_from is not None:
        shutil.copytree(tokenizer_from, storage.local_path(ctx.data.tokenizer))
    prepare_partitions(cfg, ctx, plan)
    for p in plan["partitions"]:
        write_shards(cfg, ctx, part=p["part"], num_parts=p["num_parts"])
    merge_shards(cfg, ctx, plan=plan)
    return ctx.data, storage.read_json(ctx.data.manifest)


def _shard_digests(manifest: dict) -> dict[str, list[str]]:
    return {s: [shard["sha256"] for shard in manifest["splits"][s]["shards"]] for s in SPLITS}


def test_a_corpus_with_every_line_three_times_gives_the_shards_of_each_line_once(tmp_path):
    rows = _wiki_paragraphs(400, min_words=8)
    once_paths, once = _build(_config(tmp_path, rows, "once"))
    thrice_paths, thrice = _build(
        _config(tmp_path, rows * 3, "thrice"), tokenizer_from=storage.local_path(once_paths.tokenizer)
    )
    assert _shard_digests(thrice) == _shard_digests(once)
    for split in SPLITS:
        assert thrice["splits"][split]["rows"] == once["splits"][split]["rows"]
    card = thrice["data_card"]
    assert sum(card["rows_read"].values()) == 3 * len(rows)
    assert sum(card["duplicates_removed"]["exact"].values()) == 2 * len(rows)
    assert sum(card["duplicates_removed"]["near"].values()) == 0
    assert sum(once["data_card"]["duplicates_removed"]["exact"].values()) == 0


def test_exact_dedup_off_writes_every_copy(tmp_path):
    rows = _wiki_paragraphs(200, min_words=8)
    _, manifest = _build(_config(tmp_path, rows * 2, "kept", dedup={"exact": False}))
    assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == 2 * len(rows)
    assert manifest["data_card"]["duplicates_removed"]["exact"] == dict.fromkeys(SPLITS, 0)


def _edit(row: str, rng: random.Random) -> str:
    """A small edit of a long row: one word replaced (a typo fixed, a date changed)."""
    words = row.split()
    i = rng.randrange(len(words))
    words[i] = words[i] + "s"
    return " ".join(words)


def test_planted_near_duplicates_are_found_at_the_stated_precision_and_recall(tmp_path):
    """200 distinct paragraphs of 100+ words, and a one-word edit of 100 of them (Jaccard of 5-word
    shingles at least 0.9): with near dedup at 0.8, recall >= 0.9 and precision >= 0.95 over the planted
    pairs; exact dedup alone finds none of them. (datasketch's bands for 0.8 find a pair at exactly 0.8
    40% of the time, at 0.9 93%, at 0.95 99.8%: bench/bench_dedup.py prints the curve.)"""
    rng = random.Random(0)
    originals = _wiki_paragraphs(200, min_words=100)
    planted = [_edit(r, rng) for r in originals[:100]]
    rows = originals + planted
    rng.shuffle(rows)
    cfg = _config(tmp_path, rows, "near", dedup={"near": True, "near_threshold": 0.8})
    paths, manifest = _build(cfg, partitions=3)
    from mlm_tasks.data.dedup.clusters import kept_rows

    written, corpus = set(), open_corpus(cfg.corpus)
    for part in range(3):  # the rows the writer kept, read back through the same masks
        written.update(row for _, row in kept_rows(corpus, paths, part, 3))
    removed = set(rows) - written
    true_positives = len(removed & (set(planted) | set(originals[:100])))
    recall = sum(1 for o, p in zip(originals[:100], planted, strict=True) if o not in written or p not in written) / 100
    precision = true_positives / max(len(removed), 1)
    print(f"near dedup at 0.8: recall {recall:.2f}, precision {precision:.2f}, removed {len(removed)}")
    assert recall >= 0.9 and precision >= 0.95
    assert len(removed) <= 100  # one of each planted pair stays
    near = sum(manifest["data_card"]["duplicates_removed"]["near"].values())
    assert near == len(removed) and sum(manifest["data_card"]["duplicates_removed"]["exact"].values()) == 0
    exact_only = _config(tmp_path, rows, "exact-only")
    _, plain = _build(exact_only)
    assert sum(plain["splits"][s]["rows"] for s in SPLITS) == len(rows)


def test_the_tokenizer_sample_is_bounded_recorded_and_the_same_for_any_partition_count(tmp_path):
    from mlm_tasks.data.dedup.clusters import tokenizer_sample

    rows = _wiki_paragraphs(3000, min_words=5)
    budget = 200_000
    samples = {}
    for n in (1, 4):
        cfg = _config(tmp_path, rows + rows[:500], f"sample{n}")
        paths = DataPaths(cfg.output_root, f"fp{n}")
        dedup_in_process(cfg, paths, open_corpus(cfg.corpus), n)
        sample, stats = tokenizer_sample(paths, n, budget)
        assert stats["bytes"] <= budget and stats["rows"] == len(sample) == len(set(sample))
        samples[n] = sample
    assert samples[1] == samples[4]
    train_bytes = sum(len(r.encode()) for r in set(rows))
    assert sum(len(r.encode()) for r in samples[1]) < train_bytes  # a sample, not the whole split
    cfg = _config(tmp_path, rows, "recorded", tokenizer={"vocab_size": 1000, "sample_mb": 1})
    _, manifest = _build(cfg)
    recorded = manifest["data_card"]["tokenizer_sample"]
    assert recorded["budget_bytes"] == 1_000_000 and 0 < recorded["bytes"] <= 1_000_000 and recorded["rows"] > 0


def test_row_ids_keep_a_train_copy_first():
    assert row_id("train", 5, 10**6) < row_id("validation", 0, 0) < row_id("test", 0, 0)
    rid = np.array([row_id("test", 1023, 123_456_789)], dtype=np.uint64)
    parts, indexes = parts_and_indexes(rid)
    assert (SPLITS[split_ranks(rid)[0]], parts[0], indexes[0]) == ("test", 1023, 123_456_789)
    records = np.array(
        [(7, row_id("validation", 0, 1), 1), (7, row_id("train", 2, 9), 1), (8, row_id("test", 0, 3), 1)],
        dtype=KEY_DTYPE,
    )
    pairs = pairs_in(records)
    assert [SPLITS[rank] for rank in split_ranks(pairs["row"])] == ["validation"]
    assert [SPLITS[rank] for rank in split_ranks(pairs["kept"])] == ["train"]


def test_a_rescan_is_skipped_and_a_changed_corpus_is_named(tmp_path):
    from mlm_tasks.data.dedup.clusters import kept_rows
    from mlm_tasks.data.dedup.scan import scan_partition

    rows = _wiki_paragraphs(100, min_words=5)
    cfg = _config(tmp_path, rows, "changed")
    paths = DataPaths(cfg.output_root, "fp")
    corpus = open_corpus(cfg.corpus)
    dedup_in_process(cfg, paths, corpus, 1)
    assert scan_partition(cfg, paths, corpus, 0, 1) == storage.read_json(
        f"{paths.dedup_dir}/scans/p00000-of-00001/scan.json"
    )
    (tmp_path / "changed.txt").write_text("\n".join(rows + ["one more row"]) + "\n")
    with pytest.raises(ConfigError, match=re.escape("the corpus changed under this shard set")):
        list(kept_rows(open_corpus(cfg.corpus), paths, 0, 1))


def test_rows_a_filter_drops_are_not_written_and_the_data_card_counts_them(tmp_path):
    rows = _wiki_paragraphs(300, min_words=8)
    junk = ["{ margin: 0; padding: 0 }", "* .", "3–6, 6–2, 4–6, 4–6, 7–5"]
    cfg = _config(tmp_path, rows + junk, "filtered")
    cfg = cfg.model_copy(update={"corpus": cfg.corpus.model_copy(update={"filters": type(cfg.corpus.filters)()})})
    _, manifest = _build(cfg)
    card = manifest["data_card"]
    assert card["dropped_by_filters"] == 3
    assert card["filters"]["seen"] == len(rows) + 3 and card["filters"]["kept"] == len(rows)
    assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == len(rows)


def test_the_data_card_reaches_the_model_card_and_the_report(tiny_prepared):
    """The tiny set (12 Wikipedia articles, built by build_shard_set) through the summary every later step reads."""
    from mlm_tasks.reporting.card import render_model_card

    cfg, data = tiny_prepared
    card = data["corpus"]["data_card"]
    assert sum(card["rows_read"].values()) > data["corpus"]["rows"]  # what was read, before the removals
    text = render_model_card(cfg, "run-1", {"data_info": data})
    data_section = text.split("## Data", 1)[1].split("\n## ", 1)[0]
    removed = sum(card["duplicates_removed"]["exact"].values())
    assert f"- Duplicates removed: exact {removed:,}" in data_section and "near dedup off" in data_section
    assert f"- Dropped by the row filters: {card['dropped_by_filters']:,}" in data_section
    sample = card["tokenizer_sample"]
    assert f"seeded sample of {sample['rows']:,} deduplicated train rows" in data_section
    assert f"- Rows read: train {card['rows_read']['train']:,}" in data_section


def test_the_summary_says_what_the_filters_and_the_dedup_removed(tiny_prepared):
    from mlm_tasks.steps.summary import summary

    cfg, data = tiny_prepared
    card = data["corpus"]["data_card"]
    text = summary(cfg, RunContext.of(cfg, "no-run", data["fingerprint"]), data=data)["text"]
    exact = sum(card["duplicates_removed"]["exact"].values())
    assert (
        f"Removed    of {sum(card['rows_read'].values()):,} rows read: {card['dropped_by_filters']:,} by the "
        f"filters, {exact:,} exact and 0 near duplicates"
    ) in text
