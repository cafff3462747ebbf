"""The shard set as data: its fingerprint, the tokenizer it is encoded with, and the summary steps pass on.

    fp = data_fingerprint(cfg)                       # corpus content + every setting that changes the shards
    summary = summary_for_fingerprint(cfg, fp)       # of a complete set (e.g. from a dataset-refresh event)

The shard-set steps (mlm_tasks/steps/plan_shards.py, write_shards.py, merge_shards.py) build on this.
The data fingerprint covers the corpus content and every setting that changes the shards, so an
unchanged corpus is never re-tokenized: a second run finds `_SUCCESS` and returns the same summary.
`shards.partitions` is not part of it: any partition count gives the same records, tokens and rows,
only cut at other places (see mlm_tasks/shards_parallel.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import TypedDict

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.corpus import open_corpus
from mlm_tasks.manifest import MANIFEST_VERSION, ShardSet
from mlm_tasks.paths import DataPaths, join
from mlm_tasks.tokenizer import save_tokenizer, train_unigram

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


class DataSummary(TypedDict):
    """What merge_shards returns and later steps read: small, JSON-serialisable, no secrets."""
    fingerprint: str
    data_root: str
    tokenizer_uri: str
    manifest_uri: str
    success_uri: str
    cache_hit: bool          # the complete set was there before this run
    written_here: bool       # this run's merge_shards published it
    vocab_size: int
    max_length: int
    records: dict[str, int]
    tokens: dict[str, int]
    shards: dict[str, int]
    corpus: dict


def data_summary(shard_set: ShardSet, cache_hit: bool, written_here: bool = False) -> DataSummary:
    """The summary of a complete shard set."""
    paths, manifest, splits = shard_set.paths, shard_set.data, shard_set.data["splits"]
    return {
        "fingerprint": paths.fingerprint,
        "data_root": paths.root,
        "tokenizer_uri": paths.tokenizer,
        "manifest_uri": paths.manifest,
        "success_uri": paths.success,
        "cache_hit": cache_hit,
        "written_here": written_here,
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


def is_complete(cfg: PipelineConfig, fingerprint: str) -> bool:
    """Whether a complete shard set (its `_SUCCESS`) has this fingerprint under output_root."""
    return storage.exists(DataPaths(cfg.output_root, fingerprint).success)


def summary_for_fingerprint(cfg: PipelineConfig, fingerprint: str) -> DataSummary:
    """The summary of an already prepared shard set, by fingerprint (e.g. from a dataset-refresh event)."""
    paths = DataPaths(cfg.output_root, fingerprint)
    if not storage.exists(paths.success):
        raise FileNotFoundError(f"No complete shard set for fingerprint {fingerprint} under {paths.shards_dir}: "
                                "was it deleted? Rerun mlm_dataset_refresh or trigger mlm_pretrain manually.")
    log.info("Using the shard set with fingerprint %s at %s", fingerprint, paths.shards_dir)
    return data_summary(ShardSet.load(paths), cache_hit=True)


def ensure_tokenizer(cfg: PipelineConfig, corpus, paths: DataPaths) -> None:
    """Train the Unigram tokenizer of this fingerprint unless it exists (Unigram training is not
    id-reproducible: once per fingerprint, first writer wins)."""
    if storage.exists(join(paths.tokenizer, "tokenizer.json")):
        log.info("Reusing the tokenizer already trained for this fingerprint: %s", paths.tokenizer)
        return
    t0 = time.time()
    tok = train_unigram(corpus.rows("train"), cfg.tokenizer)
    save_tokenizer(tok, paths.tokenizer, cfg.shards.max_length)
    log.info("Trained Unigram tokenizer (vocab %d) in %.1fs -> %s", tok.get_vocab_size(), time.time() - t0,
             paths.tokenizer)
