"""Step plan_shards, the first shard-set step (docs/data.md): fingerprint the data, list the partitions still to do.
python -m mlm_tasks plan_shards --config configs/tiny.yaml --set shards.partitions=4"""

from __future__ import annotations

import logging
import math

from mlm_tasks import storage
from mlm_tasks.config import MAX_PARTITIONS, PipelineConfig, ShardConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.corpus.base import Corpus
from mlm_tasks.data.shard_set import adopt, data_fingerprint
from mlm_tasks.output_root import check_writable
from mlm_tasks.paths import DataPaths, RunContext
from mlm_tasks.results import Partition, ShardPlan

log = logging.getLogger(__name__)


def plan_shards(cfg: PipelineConfig, ctx: RunContext, *, corpus=None, num_parts: int | None = None) -> ShardPlan:
    """The fingerprint (ctx.fingerprint, or the corpus's) and the partitions still to do (none: set complete)."""
    corpus = corpus or open_corpus(cfg.corpus)
    corpus_fp = None if ctx.fingerprint else corpus.fingerprint()
    paths = DataPaths(cfg.output_root, ctx.fingerprint or data_fingerprint(cfg, corpus_fingerprint=corpus_fp))
    n, fp = num_parts or partition_count(cfg.shards, corpus), paths.fingerprint
    if storage.exists(paths.success):
        log.info("Cache hit: data fingerprint %s already prepared at %s; no shard to write", fp, paths.shards_dir)
        return ShardPlan(fingerprint=fp, cache_hit=True, corpus_fingerprint=corpus_fp, partitions=[])
    if cfg.corpus.source == "tfrecord_shards":
        adopt(cfg, corpus, paths, corpus_fp or corpus.fingerprint())  # no tokenizer to train, no shard to write
        return ShardPlan(fingerprint=fp, cache_hit=False, corpus_fingerprint=corpus_fp, partitions=[])
    log.info(
        "Preparing data fingerprint %s under %s in %d partition(s) (by hand: --set shards.partitions=%d)",
        fp,
        paths.root,
        n,
        n,
    )
    # Before an hour of scanning; validate's probe is skipped in a dataset refresh and when plan_shards runs alone.
    check_writable(cfg.output_root)
    partitions = [Partition(fingerprint=fp, part=p, num_parts=n) for p in range(n)]
    return ShardPlan(fingerprint=fp, cache_hit=False, corpus_fingerprint=corpus_fp, partitions=partitions)


def partition_count(shards: ShardConfig, corpus: Corpus) -> int:
    """max(shards.partitions, ceil(MiB / shards.partition_mb)), the second term capped at MAX_PARTITIONS and
    at the corpus's units (more would be empty); a corpus of unknown size gets shards.partitions."""
    size = corpus.size_bytes()
    if size is None:
        return shards.partitions
    by_size = min(math.ceil(size / (shards.partition_mb << 20)), MAX_PARTITIONS)
    if by_size > shards.partitions:  # only then is it worth asking for units (parquet footers are read)
        by_size = min(by_size, corpus.partition_units() or by_size)
    return max(shards.partitions, by_size)
