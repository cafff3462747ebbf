"""The shard-set task group both DAGs run: plan_shards → scan_partition (one mapped task per partition) →
find_duplicates (one per bucket) → cluster_duplicates → train_tokenizer → write_shards (one per partition) →
merge_shards.

    data = shard_set(config)                    # mlm_pretrain: merge_shards' data summary (an XComArg)
    shard_set(config, announce=True, after=changed)   # mlm_dataset_refresh: the merge emits the SHARDS event

Each task calls the step of the same name in mlm_tasks/steps/. Values flow as XComArgs: plan_shards
returns the partitions still to write, which scan_partition, find_duplicates (one bucket per partition)
and write_shards are mapped over, and hands its whole plan (fingerprint, cache hit, corpus fingerprint,
partitions) to the others under the XCom key `shard_plan`. With nothing to write (the set is complete,
or shards are brought as they are) the list is empty: Airflow skips the mapped tasks, and the tasks
after them, which run unless something failed, find nothing to do (merge_shards reads the set).
`source_changed` is the refresh DAG's short-circuit before it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, XComArg, get_current_context, task

from mlm_airflow.assets import SHARDS, event_extra, triggering_shards_event
from mlm_airflow.defaults import CPU_QUEUE
from mlm_airflow.errors import bad_input_fails_fast
from mlm_airflow.tasks.step_context import step_context
from mlm_tasks.results import DataSummary, Partition, ScannedPartition, ShardPlan, WrittenPartition

log = logging.getLogger(__name__)

PLAN_KEY = "shard_plan"  # plan_shards' XCom of the whole plan, for the tasks after it


@task.short_circuit
def source_changed(config: dict) -> str | bool:
    """The data fingerprint if no complete shard set has it yet under output_root, else False (the
    rest of the refresh is skipped: nothing written, no asset event, no training triggered)."""
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
    """The partitions write_shards maps over (possibly none); the whole plan goes to merge_shards as
    the XCom PLAN_KEY. A run triggered by a dataset-refresh event uses exactly the announced set
    (never a re-fingerprint of a source that moved on)."""
    from mlm_tasks.data.shard_set import summary_for_fingerprint
    from mlm_tasks.steps.plan_shards import plan_shards as step

    cfg, ctx = step_context(config)
    with bad_input_fails_fast():
        event = triggering_shards_event(context)
        if event:
            log.info(
                "Triggered by dataset refresh: fingerprint %s under %s", event["fingerprint"], event["output_root"]
            )
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


def _label_partition(partition: Partition) -> None:
    # The grid shows "partition 2 of 4", not a bare index. A key added to the context for map_index_template is
    # Airflow's documented way; its Context TypedDict lists only its own keys.
    label = f"partition {partition['part'] + 1} of {partition['num_parts']}"
    get_current_context()["partition_label"] = label  # type: ignore[typeddict-unknown-key]


@task(
    queue=CPU_QUEUE,
    execution_timeout=timedelta(hours=24),
    map_index_template="{{ partition_label }}",
    multiple_outputs=False,
)
def scan_partition(config: dict, partition: Partition) -> ScannedPartition:
    """One mapped task per partition: its rows filtered and hashed for dedup, its tokenizer candidates."""
    from mlm_tasks.steps.scan_partition import scan_partition as step

    _label_partition(partition)
    cfg, ctx = step_context(config, partition)
    with bad_input_fails_fast():
        return step(cfg, ctx, part=partition["part"], num_parts=partition["num_parts"])


@task(
    queue=CPU_QUEUE,
    execution_timeout=timedelta(hours=6),
    map_index_template="{{ bucket_label }}",
    multiple_outputs=False,
)
def find_duplicates(config: dict, partition: Partition) -> dict[str, int]:
    """One mapped task per bucket, as many buckets as partitions (a mapped task expands over a task's return
    value only, and this keeps each bucket about one partition's keys): the duplicate pairs of bucket `part`."""
    from mlm_tasks.steps.find_duplicates import find_duplicates as step

    label = f"bucket {partition['part'] + 1} of {partition['num_parts']}"
    get_current_context()["bucket_label"] = label  # type: ignore[typeddict-unknown-key]
    cfg, ctx = step_context(config, partition)
    with bad_input_fails_fast():
        return step(cfg, ctx, bucket=partition["part"], num_parts=partition["num_parts"])


# After the mapped tasks before them, or after none (a complete set: they were skipped), as merge_shards.
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

    _label_partition(partition)
    cfg, ctx = step_context(config, partition)
    with bad_input_fails_fast():
        return step(cfg, ctx, part=partition["part"], num_parts=partition["num_parts"])


# After every write_shards, or after none: with nothing to write the mapped task is skipped, and the merge
# still runs (none_failed); a failed partition stops it (upstream_failed).
@task(queue=CPU_QUEUE, multiple_outputs=False, trigger_rule="none_failed")
def merge_shards(config: dict, plan: ShardPlan, announce: bool = False, **context: Any) -> DataSummary:
    """The merged, published shard set of `plan`; in mlm_dataset_refresh (`announce`), the SHARDS
    event's extra says exactly which data it is."""
    from mlm_tasks.steps.merge_shards import merge_shards as step

    cfg, ctx = step_context(config, plan)
    with bad_input_fails_fast():
        data = step(cfg, ctx, plan=plan)
    if announce:
        context["outlet_events"][SHARDS].extra = event_extra(config, data)
        log.info(
            "Announcing shards %s on asset %s: %s train records, %s train tokens",
            data["fingerprint"],
            SHARDS.name,
            data["records"].get("train"),
            data["tokens"].get("train"),
        )
    return data


def shard_set(config: XComArg, *, announce: bool = False, after: XComArg | None = None) -> XComArg:
    """The shard-set tasks, wired (after `after`, e.g. the refresh's short-circuit, so its skip reaches
    them); merge_shards' XComArg (the data summary). Task ids are the step names."""
    with TaskGroup(
        "shard_set",
        prefix_group_id=False,
        tooltip="plan; dedup: scan (per partition), match (per bucket), cluster; tokenizer; write; merge",
    ):
        # TaskFlow: a task called here takes XComArgs (Airflow hands it their values at run time), but Airflow's
        # stubs type the call with the function's own parameters (apache/airflow#39514).
        partitions = plan_shards(config)  # type: ignore[arg-type]
        if after is not None:
            after >> partitions
        # The same task's other XComs: `xcomarg[key]` is XComArg's documented API (a task's call returns
        # a PlainXComArg, which has it), but the call is typed as returning the base class, which lacks it.
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
