"""Step plan_shards: fingerprint the data and list the partitions to scan and write and the buckets to match.

    python -m mlm_tasks plan_shards --config configs/tiny.yaml --set shards.partitions=4

First of the shard-set steps, the same in both DAGs and the CLI: plan_shards → scan_partition (one
task per partition) → find_duplicates (one per bucket, as many as partitions) → cluster_duplicates → train_tokenizer →
write_shards (one per partition) → merge_shards. The plan says which
partitions are still to write; none when a complete shard set already has this fingerprint or
shards were brought as they are (the DAGs then skip write_shards, and the merge only reads the set).
"""

from __future__ import annotations

import logging

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.shard_set import data_fingerprint
from mlm_tasks.paths import DataPaths, RunContext
from mlm_tasks.results import Partition, ShardPlan
from mlm_tasks.storage import check_writable

log = logging.getLogger(__name__)


def plan_shards(cfg: PipelineConfig, ctx: RunContext, *, corpus=None, num_parts: int | None = None) -> ShardPlan:
    """The fingerprint (ctx.fingerprint, or computed from the corpus) and the partitions still to do
    (none when the set is complete)."""
    corpus = corpus or open_corpus(cfg.corpus)
    corpus_fp = None if ctx.fingerprint else corpus.fingerprint()
    paths = DataPaths(cfg.output_root, ctx.fingerprint or data_fingerprint(cfg, corpus_fingerprint=corpus_fp))
    n = num_parts or cfg.shards.partitions
    if storage.exists(paths.success):
        log.info(
            "Cache hit: data fingerprint %s already prepared at %s; no shard to write",
            paths.fingerprint,
            paths.shards_dir,
        )
        return ShardPlan(fingerprint=paths.fingerprint, cache_hit=True, corpus_fingerprint=corpus_fp, partitions=[])
    if cfg.corpus.source == "tfrecord_shards":
        from mlm_tasks.data.shard_set import adopt

        adopt(cfg, corpus, paths, corpus_fp or corpus.fingerprint())  # no tokenizer to train, no shard to write
        return ShardPlan(fingerprint=paths.fingerprint, cache_hit=False, corpus_fingerprint=corpus_fp, partitions=[])
    log.info("Preparing data fingerprint %s under %s in %d partition(s)", paths.fingerprint, paths.root, n)
    # Before an hour of scanning, not after. validate probes too, but not in a dataset refresh
    # (probe_write=False: an unchanged source writes nothing) nor when plan_shards runs alone (the CLI).
    check_writable(cfg.output_root)
    return ShardPlan(
        fingerprint=paths.fingerprint,
        cache_hit=False,
        corpus_fingerprint=corpus_fp,
        partitions=[Partition(fingerprint=paths.fingerprint, part=p, num_parts=n) for p in range(n)],
    )
