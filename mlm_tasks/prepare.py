"""Step: prepare the data — fingerprint the corpus, train the tokenizer, write the shards; or reuse them.

    python -m mlm_tasks prepare-data --config configs/default.yaml       # all of it, in one process

One shard-writing path for the CLI and the DAGs (mlm_tasks/shards_parallel.py). The DAGs fan it out
over `shards.partitions` tasks (Airflow dynamic task mapping); prepare-data runs the same three
functions in this process with a single partition:

    plan = plan_data(cfg)                                   # fingerprint, tokenizer, partitions to write
    for p in plan["partitions"]:                            # each one a mapped task, in parallel
        write_data_partition(cfg, plan["fingerprint"], p["part"], p["num_parts"])
    summary = finish_data(cfg, plan["fingerprint"])         # merged manifest, then _SUCCESS

The data fingerprint covers the corpus content and every setting that changes the shards, so an
unchanged corpus is never re-tokenized: a second run finds `_SUCCESS` and returns the same manifest.
`shards.partitions` is not part of it: any partition count gives the same records, tokens and rows,
only cut at other places (see mlm_tasks/shards_parallel.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.corpus import open_corpus
from mlm_tasks.paths import DataPaths, join
from mlm_tasks.manifest import MANIFEST_VERSION, ShardSet
from mlm_tasks.tokenizer import load_tokenizer, publish_tokenizer, train_unigram

log = logging.getLogger(__name__)


def data_fingerprint(cfg: PipelineConfig, corpus=None, corpus_fingerprint: str | None = None) -> str:
    """The shard set's key: the corpus content (its fingerprint, computed unless given) and every
    setting that changes the shards."""
    if corpus_fingerprint is None:
        corpus_fingerprint = (corpus or open_corpus(cfg.corpus)).fingerprint()
    if cfg.corpus.source == "tfrecord_shards":  # shards brought as they are: no setting of ours changes them
        key = {"corpus": corpus_fingerprint, "max_length": cfg.shards.max_length, "manifest_version": MANIFEST_VERSION}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    key = {
        "corpus": corpus_fingerprint,
        "splits": [cfg.corpus.validation_fraction, cfg.corpus.test_fraction],
        "tokenizer": cfg.tokenizer.model_dump(),
        "max_length": cfg.shards.max_length,
        "records_per_shard": cfg.shards.records_per_shard,
        "manifest_version": MANIFEST_VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def data_summary(shard_set: ShardSet, cache_hit: bool) -> dict:
    """What downstream tasks (and XCom) need: small, JSON-serialisable, no secrets."""
    paths, manifest, splits = shard_set.paths, shard_set.data, shard_set.data["splits"]
    return {
        "fingerprint": paths.fingerprint,
        "data_root": paths.root,
        "tokenizer_uri": paths.tokenizer,
        "manifest_uri": paths.manifest,
        "success_uri": paths.success,
        "cache_hit": cache_hit,
        "vocab_size": shard_set.vocab_size,
        "max_length": shard_set.max_length,
        "records": {s: shard_set.records(s) for s in splits},
        "tokens": {s: shard_set.tokens(s) for s in splits},
        "shards": {s: len(shard_set.shards(s)) for s in splits},
        "corpus": {"rows": sum(splits[s].get("rows") or 0 for s in splits),
                   "articles": sum(splits[s].get("articles") or 0 for s in splits) or None,
                   "characters": sum(splits[s].get("characters") or 0 for s in splits),
                   "source": manifest["corpus_source"], "credit": manifest.get("credit", "")},
    }


def summary_for_fingerprint(cfg: PipelineConfig, fingerprint: str) -> dict:
    """The summary of an already prepared shard set, by fingerprint (e.g. from a dataset-refresh event)."""
    paths = DataPaths(cfg.output_root, fingerprint)
    if not storage.exists(paths.success):
        raise FileNotFoundError(f"No complete shard set for fingerprint {fingerprint} under {paths.shards_dir}: "
                                "was it deleted? Rerun mlm_dataset_refresh or trigger mlm_pretrain manually.")
    log.info("Using the shard set with fingerprint %s at %s", fingerprint, paths.shards_dir)
    return data_summary(ShardSet.load(paths), cache_hit=True)


def _ensure_tokenizer(cfg: PipelineConfig, corpus, paths: DataPaths) -> None:
    if storage.exists(join(paths.tokenizer, "tokenizer.json")):
        log.info("Reusing the tokenizer already trained for this fingerprint: %s", paths.tokenizer)
        return
    t0 = time.time()
    tok = train_unigram(corpus.rows("train"), cfg.tokenizer)
    publish_tokenizer(tok, paths.tokenizer, cfg.shards.max_length)
    log.info("Trained Unigram tokenizer (vocab %d) in %.1fs -> %s", tok.get_vocab_size(), time.time() - t0,
             paths.tokenizer)


def manifest_extra(cfg: PipelineConfig, corpus, corpus_fingerprint: str, paths: DataPaths, tokenizer) -> dict:
    """What the manifest says besides the shards: vocabulary, tokenizer hash, source, credit, special ids."""
    return {
        "vocab_size": len(tokenizer),
        "tokenizer_sha256": hashlib.sha256(
            storage.read_bytes(join(paths.tokenizer, "tokenizer.json"))).hexdigest(),
        "corpus_source": cfg.corpus.source,
        "corpus_fingerprint": corpus_fingerprint,
        "credit": corpus.credit,
        "special_ids": {"pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id,
                        "bos": tokenizer.cls_token_id, "eos": tokenizer.sep_token_id},
    }


def prepare_data(cfg: PipelineConfig) -> dict:
    """Everything in this process: the DAG's plan, write and merge, with a single partition (the
    tokenizer's own threads use the cores)."""
    corpus = open_corpus(cfg.corpus)
    plan = plan_data(cfg, corpus=corpus, num_parts=1)
    for p in plan["partitions"]:
        write_data_partition(cfg, plan["fingerprint"], p["part"], p["num_parts"], corpus=corpus)
    return finish_data(cfg, plan["fingerprint"], plan["cache_hit"], plan["corpus_fingerprint"], num_parts=1,
                       corpus=corpus)


def plan_data(cfg: PipelineConfig, fingerprint: str | None = None, corpus=None, num_parts: int | None = None) -> dict:
    """First task of the fan-out: the fingerprint, the tokenizer trained and published (first writer
    wins), and the partitions still to write — none when a complete shard set already has it."""
    corpus = corpus or open_corpus(cfg.corpus)
    corpus_fp = None if fingerprint else corpus.fingerprint()
    paths = DataPaths(cfg.output_root, fingerprint or data_fingerprint(cfg, corpus_fingerprint=corpus_fp))
    n = num_parts or cfg.shards.partitions
    if storage.exists(paths.success):
        log.info("Cache hit: data fingerprint %s already prepared at %s; no shard to write",
                 paths.fingerprint, paths.shards_dir)
        return {"fingerprint": paths.fingerprint, "cache_hit": True, "corpus_fingerprint": corpus_fp,
                "partitions": []}
    if cfg.corpus.source == "tfrecord_shards":
        from mlm_tasks.byo_shards import adopt

        adopt(cfg, corpus, paths, corpus_fp or corpus.fingerprint())  # no tokenizer to train, no shard to write
        return {"fingerprint": paths.fingerprint, "cache_hit": False, "corpus_fingerprint": corpus_fp,
                "partitions": []}
    log.info("Preparing data fingerprint %s under %s in %d partition(s)", paths.fingerprint, paths.root, n)
    _ensure_tokenizer(cfg, corpus, paths)
    return {"fingerprint": paths.fingerprint, "cache_hit": False, "corpus_fingerprint": corpus_fp,
            "partitions": [{"part": p, "num_parts": n} for p in range(n)]}


def write_data_partition(cfg: PipelineConfig, fingerprint: str, part: int, num_parts: int, corpus=None) -> dict:
    """One mapped task (`write_shards`): write partition `part` of `num_parts`, reading it from the
    corpus once for every split; a small summary for XCom."""
    from mlm_tasks.shards_parallel import write_partition

    t0 = time.time()
    partial = write_partition(cfg, DataPaths(cfg.output_root, fingerprint), part, num_parts, corpus=corpus)
    splits = partial["splits"]
    seconds = time.time() - t0
    tokens = sum(e["records"] for e in splits.values()) * cfg.shards.max_length
    log.info("Partition %d of %d: %s in %.1fs (%.0f tokens/s)", part + 1, num_parts,
             ", ".join(f"{s} {e['records']} records ({e['rows']} rows)" for s, e in splits.items()),
             seconds, tokens / max(seconds, 1e-9))
    return {"part": part, "num_parts": num_parts, "records": {s: e["records"] for s, e in splits.items()},
            "rows": {s: e["rows"] for s, e in splits.items()}}


def finish_data(cfg: PipelineConfig, fingerprint: str, cache_hit: bool = False,
                corpus_fingerprint: str | None = None, num_parts: int | None = None, corpus=None) -> dict:
    """Last task of the fan-out: merge the partitions into manifest.json and _SUCCESS (or read the
    complete set already there); the data summary downstream tasks use. `corpus_fingerprint` is the
    plan's, so a large local corpus is not hashed a second time."""
    from mlm_tasks.shards_parallel import merge_partitions

    paths = DataPaths(cfg.output_root, fingerprint)
    if storage.exists(paths.success):
        return data_summary(ShardSet.load(paths), cache_hit=cache_hit)
    num_parts = num_parts or cfg.shards.partitions
    corpus = corpus or open_corpus(cfg.corpus)
    tokenizer = load_tokenizer(paths.tokenizer, cfg.shards.max_length)
    corpus_fp = corpus_fingerprint or corpus.fingerprint()
    extra = {**manifest_extra(cfg, corpus, corpus_fp, paths, tokenizer), "partitions": num_parts}
    shard_set = merge_partitions(cfg, paths, num_parts, extra)
    log.info("Published shard set %s: %s", paths.shards_dir,
             ", ".join(f"{s} {shard_set.records(s)} records" for s in shard_set.splits))
    return data_summary(shard_set, cache_hit=False)
