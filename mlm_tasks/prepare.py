"""Step: prepare the data — fingerprint the corpus, train the tokenizer, write the shards; or reuse them.

    python -m mlm_tasks prepare-data --config configs/default.yaml

The data fingerprint covers the corpus content and every setting that changes the shards, so an
unchanged corpus is never re-tokenized: a second run finds `_SUCCESS` and returns the same manifest.
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
from mlm_tasks.shards import MANIFEST_VERSION, write_shards
from mlm_tasks.tokenizer import load_tokenizer, publish_tokenizer, train_unigram

log = logging.getLogger(__name__)


def data_fingerprint(cfg: PipelineConfig, corpus=None) -> str:
    corpus = corpus or open_corpus(cfg.corpus)
    key = {
        "corpus": corpus.fingerprint(),
        "splits": [cfg.corpus.validation_fraction, cfg.corpus.test_fraction],
        "tokenizer": cfg.tokenizer.model_dump(),
        "max_length": cfg.shards.max_length,
        "records_per_shard": cfg.shards.records_per_shard,
        "manifest_version": MANIFEST_VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def data_summary(paths: DataPaths, manifest: dict, cache_hit: bool) -> dict:
    """What downstream tasks (and XCom) need: small, JSON-serialisable, no secrets."""
    splits = manifest["splits"]
    return {
        "fingerprint": paths.fingerprint,
        "data_root": paths.root,
        "tokenizer_uri": paths.tokenizer,
        "manifest_uri": paths.manifest,
        "success_uri": paths.success,
        "cache_hit": cache_hit,
        "vocab_size": manifest["vocab_size"],
        "max_length": manifest["max_length"],
        "records": {s: splits[s]["records"] for s in splits},
        "tokens": {s: splits[s]["tokens"] for s in splits},
        "shards": {s: len(splits[s]["shards"]) for s in splits},
        "corpus": {"rows": sum(splits[s]["rows"] for s in splits),
                   "articles": sum(splits[s].get("articles", 0) for s in splits) or None,
                   "characters": sum(splits[s]["characters"] for s in splits),
                   "source": manifest["corpus_source"], "credit": manifest.get("credit", "")},
    }


def summary_for_fingerprint(cfg: PipelineConfig, fingerprint: str) -> dict:
    """The summary of an already prepared shard set, by fingerprint (e.g. from a dataset-refresh event)."""
    paths = DataPaths(cfg.output_root, fingerprint)
    if not storage.exists(paths.success):
        raise FileNotFoundError(f"No complete shard set for fingerprint {fingerprint} under {paths.shards_dir}: "
                                "was it deleted? Rerun mlm_dataset_refresh or trigger mlm_pretrain manually.")
    log.info("Using the shard set with fingerprint %s at %s", fingerprint, paths.shards_dir)
    return data_summary(paths, storage.read_json(paths.manifest), cache_hit=True)


def prepare_data(cfg: PipelineConfig) -> dict:
    corpus = open_corpus(cfg.corpus)
    paths = DataPaths(cfg.output_root, data_fingerprint(cfg, corpus))
    if storage.exists(paths.success):
        manifest = storage.read_json(paths.manifest)
        log.info("Cache hit: data fingerprint %s already prepared at %s (%d train records); nothing to do",
                 paths.fingerprint, paths.shards_dir, manifest["splits"]["train"]["records"])
        return data_summary(paths, manifest, cache_hit=True)

    log.info("Preparing data fingerprint %s under %s", paths.fingerprint, paths.root)
    if not storage.exists(join(paths.tokenizer, "tokenizer.json")):
        t0 = time.time()
        tok = train_unigram(corpus.rows("train"), cfg.tokenizer)
        publish_tokenizer(tok, paths.tokenizer, cfg.shards.max_length)
        log.info("Trained Unigram tokenizer (vocab %d) in %.1fs -> %s", tok.get_vocab_size(),
                 time.time() - t0, paths.tokenizer)
    else:
        log.info("Reusing the tokenizer already trained for this fingerprint: %s", paths.tokenizer)
    # Always encode with the tokenizer read back from storage: the one every reader will use.
    tokenizer = load_tokenizer(paths.tokenizer, cfg.shards.max_length)
    extra = {
        "vocab_size": len(tokenizer),
        "tokenizer_sha256": hashlib.sha256(
            storage.read_bytes(join(paths.tokenizer, "tokenizer.json"))).hexdigest(),
        "corpus_source": cfg.corpus.source,
        "corpus_fingerprint": corpus.fingerprint(),
        "credit": corpus.credit,
        "special_ids": {"pad": tokenizer.pad_token_id, "mask": tokenizer.mask_token_id,
                        "bos": tokenizer.cls_token_id, "eos": tokenizer.sep_token_id},
    }
    manifest = write_shards(corpus, tokenizer, cfg.shards, paths, extra)
    return data_summary(paths, manifest, cache_hit=False)
