"""Step merge_shards: merge the written partitions into one manifest, then `_SUCCESS`; a complete set is only read.
python -m mlm_tasks merge_shards --config c.yaml --set shards.partitions=4 --data-fingerprint FP"""

from __future__ import annotations

import logging

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.corpus import open_corpus
from mlm_tasks.data.shard_set import ShardSet, config_weights, data_summary, manifest_extra
from mlm_tasks.errors import MissingArtifactError
from mlm_tasks.paths import RunContext
from mlm_tasks.results import DataSummary, ShardPlan

log = logging.getLogger(__name__)


def data_card(cfg: PipelineConfig, ctx: RunContext) -> dict:
    """What went in and what was removed (rows, filters, duplicates, the tokenizer's sample), for the card."""
    from mlm_tasks.data.dedup.clusters import clusters_marker

    clusters = storage.read_json_if_exists(clusters_marker(ctx.data)) or {}
    return {
        "rows_read": clusters.get("rows"),
        "filters": clusters.get("filters", {}),
        "dropped_by_filters": clusters.get("dropped_by_filters"),
        "duplicates_removed": clusters.get("duplicates_removed"),
        "dedup": cfg.dedup.model_dump(),
        "tokenizer_sample": storage.read_json_if_exists(ctx.data.tokenizer_sample),
    }


def merge_shards(cfg: PipelineConfig, ctx: RunContext, *, plan: ShardPlan | None = None, corpus=None) -> DataSummary:
    """The shard set of `plan` (plan_shards' result; None: `shards.partitions` written for ctx's fingerprint)."""
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.data.writer import merge_partitions

    paths = ctx.data
    if storage.exists(paths.success):
        cache_hit = plan["cache_hit"] if plan else False
        return data_summary(ShardSet.load(paths), cache_hit=cache_hit, weights=config_weights(cfg))
    if plan is not None and not plan["partitions"]:
        # No retry of this run can fix it: its plan, an XCom, says there is nothing to write.
        raise MissingArtifactError(
            f"The shard set {paths.shards_dir} was complete when plan_shards ran, but its _SUCCESS is gone "
            "(deleted meanwhile?): start a new run of this DAG (mlm_pretrain or mlm_dataset_refresh) with the "
            "same settings, so its plan_shards plans the set anew; clearing this task alone reads the same plan."
        )
    num_parts = len(plan["partitions"]) if plan else cfg.shards.partitions
    corpus = corpus or open_corpus(cfg.corpus)
    tokenizer = load_tokenizer(paths.tokenizer, cfg.shards.max_length)
    corpus_fp = (plan["corpus_fingerprint"] if plan else None) or corpus.fingerprint()
    extra = {
        **manifest_extra(cfg, corpus, corpus_fp, paths, tokenizer),
        "partitions": num_parts,
        "data_card": data_card(cfg, ctx),
    }
    shard_set = merge_partitions(cfg, paths, num_parts, extra)
    counts = ", ".join(f"{s} {shard_set.records(s)} records" for s in shard_set.splits)
    log.info("Published shard set %s: %s", paths.shards_dir, counts)
    return data_summary(shard_set, cache_hit=False, written_here=True, weights=config_weights(cfg))
