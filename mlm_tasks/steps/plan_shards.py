"""Step plan_shards: fingerprint the data, train its tokenizer, and list the partitions to write.

    python -m mlm_tasks plan_shards --config configs/tiny.yaml --set shards.partitions=4

First of the three shard-set steps, the same in both DAGs and the CLI:
plan_shards → write_shards (one task per partition, in parallel) → merge_shards. The plan is a list
of partitions, never empty: when a complete shard set already has this fingerprint (or shards were
brought as they are), it holds one entry with `num_parts` 0 (nothing to write), so the merge still
learns the fingerprint from what the writes hand on.
"""
from __future__ import annotations

import logging
from typing import TypedDict

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.shard_set import data_fingerprint, ensure_tokenizer
from mlm_tasks.paths import DataPaths, RunContext
from mlm_tasks.storage import check_writable

log = logging.getLogger(__name__)


class Partition(TypedDict):
    fingerprint: str
    part: int
    num_parts: int                    # 0: the shard set is complete, nothing to write
    cache_hit: bool                   # the complete set was there before this run
    corpus_fingerprint: str | None    # the plan's, so the merge does not hash a large corpus again


def nothing_to_write(fingerprint: str, cache_hit: bool, corpus_fingerprint: str | None = None) -> list[Partition]:
    return [Partition(fingerprint=fingerprint, part=0, num_parts=0, cache_hit=cache_hit,
                      corpus_fingerprint=corpus_fingerprint)]


def plan_shards(cfg: PipelineConfig, ctx: RunContext, *, corpus=None, num_parts: int | None = None) -> list[Partition]:
    """The fingerprint (ctx.fingerprint, or computed from the corpus), the tokenizer trained and saved
    (first writer wins), and the partitions still to write."""
    corpus = corpus or open_corpus(cfg.corpus)
    corpus_fp = None if ctx.fingerprint else corpus.fingerprint()
    paths = DataPaths(cfg.output_root, ctx.fingerprint or data_fingerprint(cfg, corpus_fingerprint=corpus_fp))
    n = num_parts or cfg.shards.partitions
    if storage.exists(paths.success):
        log.info("Cache hit: data fingerprint %s already prepared at %s; no shard to write",
                 paths.fingerprint, paths.shards_dir)
        return nothing_to_write(paths.fingerprint, cache_hit=True, corpus_fingerprint=corpus_fp)
    if cfg.corpus.source == "tfrecord_shards":
        from mlm_tasks.data.shard_set import adopt

        adopt(cfg, corpus, paths, corpus_fp or corpus.fingerprint())  # no tokenizer to train, no shard to write
        return nothing_to_write(paths.fingerprint, cache_hit=False, corpus_fingerprint=corpus_fp)
    log.info("Preparing data fingerprint %s under %s in %d partition(s)", paths.fingerprint, paths.root, n)
    # Before an hour of tokenizer training, not after. validate probes too, but not in a dataset refresh
    # (probe_write=False: an unchanged source writes nothing) nor when plan_shards runs alone (the CLI).
    check_writable(cfg.output_root)
    ensure_tokenizer(cfg, corpus, paths)
    return [Partition(fingerprint=paths.fingerprint, part=p, num_parts=n, cache_hit=False, corpus_fingerprint=corpus_fp)
            for p in range(n)]
