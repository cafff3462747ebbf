"""The shard-set task group both DAGs run: plan_shards → scan_partition (mapped) → find_duplicates (mapped) →
cluster_duplicates → train_tokenizer → write_shards (mapped) → merge_shards.

    data = shard_set(config)                    # mlm_pretrain: merge_shards' data summary (an XComArg)
    shard_set(config, announce=True, after=changed)   # mlm_dataset_refresh: the merge emits the SHARDS event
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, XComArg, get_current_context, task

from mlm_airflow.assets import SHARDS, event_extra, triggering_shards_event
from mlm_airflow.defaults import CPU_QUEUE
from mlm_airflow.tasks.step_context import bad_input_fails_fast, step_context
from mlm_tasks.results import DataSummary, Partition, ScannedPartition, ShardPlan, WrittenPartition

log = logging.getLogger(__name__)

PLAN_KEY = "shard_plan"  # plan_shards' XCom of the whole plan, for the tasks after it


@task.short_circuit
def source_changed(config: dict) -> str | bool:
    """The data fingerprint if no complete shard set has it yet under output_root, else False (skip the rest)."""
    from mlm_tasks.data.shard_set import data_fingerprint, is_complete

    cfg, _ = step_context(config)
    with bad_input_fails_fast():
        fingerprint = data_fingerprint(cfg)
    if is_complete(cfg, fingerprint):
        log.info(
            "Source unchanged: data fingerprint %s is already prepared under %s. Nothing to build and no "
            "asset event, so no training run is triggered.",
            fingerprint,
            cfg.output_root,
        )
        return False
    log.info(
        "Source changed: no complete shard set for data fingerprint %s under %s; building it.",
        fingerprint,
        cfg.output_root,
    )
    return fingerprint


@task(queue=CPU_QUEUE, execution_timeout=timedelta(hours=12), multiple_outputs=False)
def plan_shards(config: dict, **context: Any) -> list[Partition]:
    """The partitions the mapped tasks map over (possibly none); the whole plan goes out as XCom PLAN_KEY.
    A run triggered by a dataset-refresh event uses exactly the announced set, never a re-fingerprint."""
    from mlm_tasks.data.shard_set import summary_for_fingerprint
    from mlm_tasks.steps.plan_shards import plan_shards as step

    cfg, ctx = step_context(config)
    with bad_input_fails_fast():
        event = triggering_shards_event(context)
        if event:
            fingerprint = summary_for_fingerprint(cfg, event["fingerprint"])["fingerprint"]
            plan = ShardPlan(fingerprint=fingerprint, cache_hit=True, corpus_fingerprint=None, partitions=[])
        else:
            plan = step(cfg, ctx)
    context["ti"].xcom_push(PLAN_KEY, plan)
    if not plan["partitions"]:
        log.info(
            "Nothing to write for data %s: write_shards is skipped, merge_shards reads the set.", plan["fingerprint"]
        )
    return plan["partitions"]


def _mapped(step: Callable[..., Any], config: dict, partition: Partition, noun: str, index_arg: str) -> Any:
    """`step` on one partition (its index passed as `index_arg`); the grid shows "<noun> 2 of 4", not an index."""
    # A key added to the context for map_index_template is Airflow's documented way; its TypedDict lacks it.
    label = f"{noun} {partition['part'] + 1} of {partition['num_parts']}"
    get_current_context()[f"{noun}_label"] = label  # type: ignore[literal-required]
    cfg, ctx = step_context(config, partition)
    with bad_input_fails_fast():
        return step(cfg, ctx, **{index_arg: partition["part"]}, num_parts=partition["num_parts"])


@task(
    queue=CPU_QUEUE,
    execution_timeout=timedelta(hours=24),
    map_index_template="{{ partition_label }}",
    multiple_outputs=False,
)
def scan_partition(config: dict, partition: Partition) -> ScannedPartition:
    """One mapped task per partition: its rows filtered and hashed for dedup, its tokenizer candidates."""
    from mlm_tasks.steps.scan_partition import scan_partition as step

    return _mapped(step, config, partition, "partition", "part")


@task(
    queue=CPU_QUEUE,
    execution_timeout=timedelta(hours=6),
    map_index_template="{{ bucket_label }}",
    multiple_outputs=False,
)
def find_duplicates(config: dict, partition: Partition) -> dict[str, int]:
    """One mapped task per bucket, as many as partitions (a mapped task expands over a task's return value only):
    the duplicate pairs of bucket `part`."""
    from mlm_tasks.steps.find_duplicates import find_duplicates as step

    return _mapped(step, config, partition, "bucket", "bucket")


# none_failed: after the mapped tasks, or after none (a complete set: they were skipped), as merge_shards.
@task(queue=CPU_QUEUE, execution_timeout=timedelta(hours=6), multiple_outputs=False, trigger_rule="none_failed")
def cluster_duplicates(config: dict, plan: ShardPlan) -> dict:
    """The rows the writer skips (one per cluster of duplicates kept) and what each filter dropped."""
    from mlm_tasks.steps.cluster_duplicates import cluster_duplicates as step

    if not plan["partitions"]:
        return {}
    cfg, ctx = step_context(config, plan)
    with bad_input_fails_fast():
        return step(cfg, ctx, num_parts=len(plan["partitions"]))


@task(queue=CPU_QUEUE, execution_timeout=timedelta(hours=12), multiple_outputs=False, trigger_rule="none_failed")
def train_tokenizer(config: dict, plan: ShardPlan) -> dict:
    """The Unigram tokenizer, trained on a seeded sample of the deduplicated train rows (or the base model's)."""
    from mlm_tasks.steps.train_tokenizer import train_tokenizer as step

    if not plan["partitions"]:
        return {}
    cfg, ctx = step_context(config, plan)
    with bad_input_fails_fast():
        return step(cfg, ctx, num_parts=len(plan["partitions"]))


@task(
    queue=CPU_QUEUE,
    execution_timeout=timedelta(hours=24),
    map_index_template="{{ partition_label }}",
    multiple_outputs=False,
    trigger_rule="none_failed",
)
def write_shards(config: dict, partition: Partition) -> WrittenPartition:
    """One mapped task per partition: its TFRecord shards and partial manifest."""
    from mlm_tasks.steps.write_shards import write_shards as step

    return _mapped(step, config, partition, "partition", "part")


# none_failed: after every write_shards, or none (skipped: nothing to write); a failed partition stops it.
@task(queue=CPU_QUEUE, multiple_outputs=False, trigger_rule="none_failed")
def merge_shards(config: dict, plan: ShardPlan, announce: bool = False, **context: Any) -> DataSummary:
    """The merged, published shard set of `plan`; with `announce`, the SHARDS event says which data it is."""
    from mlm_tasks.steps.merge_shards import merge_shards as step

    cfg, ctx = step_context(config, plan)
    with bad_input_fails_fast():
        data = step(cfg, ctx, plan=plan)
    if announce:
        context["outlet_events"][SHARDS].extra = event_extra(config, data)
        log.info(
            "Announcing shards %s on asset %s: %s train records, %s train tokens",
            *(data["fingerprint"], SHARDS.name, data["records"].get("train"), data["tokens"].get("train")),
        )
    return data


def shard_set(config: XComArg, *, announce: bool = False, after: XComArg | None = None) -> XComArg:
    """The shard-set tasks, wired after `after` (the refresh's short-circuit, whose skip reaches them);
    merge_shards' XComArg (the data summary)."""
    with TaskGroup(
        "shard_set",
        prefix_group_id=False,
        tooltip="plan; dedup: scan (per partition), match (per bucket), cluster; tokenizer; write; merge",
    ):
        # Airflow's stubs type a TaskFlow call with the function's parameters, not XComArgs (apache/airflow#39514).
        partitions = plan_shards(config)  # type: ignore[arg-type]
        if after is not None:
            after >> partitions
        # `xcomarg[key]` is PlainXComArg's documented API; the call is typed as returning the base class.
        plan = partitions[PLAN_KEY]  # type: ignore[index]
        scanned = scan_partition.partial(config=config).expand(partition=partitions)
        matched = find_duplicates.partial(config=config).expand(partition=partitions)
        clustered = cluster_duplicates(config, plan)  # type: ignore[arg-type]
        tokenizer = train_tokenizer(config, plan)  # type: ignore[arg-type]
        written = write_shards.partial(config=config).expand(partition=partitions)
        merge = merge_shards.override(outlets=[SHARDS] if announce else [])
        data = merge(config, plan, announce=announce)  # type: ignore[arg-type]
        scanned >> matched >> clustered >> tokenizer >> written >> data
        return data
