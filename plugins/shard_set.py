"""The shard-set task group both DAGs run: plan_shards → write_shards (one mapped task per partition) → merge_shards.

    data = shard_set(config)                    # mlm_pretrain: merge_shards' data summary (an XComArg)
    shard_set(config, announce=True, after=changed)   # mlm_dataset_refresh: the merge emits the SHARDS event

Each task calls the step of the same name in mlm_tasks/steps/. Values flow as XComArgs: the plan (a
list of partitions, never empty) is what write_shards is mapped over, and the written partitions
hand the fingerprint on to the merge. `source_changed` is the refresh DAG's short-circuit before it.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, get_current_context, task

from mlm_assets import SHARDS, event_extra, triggering_shards_event
from step_context import step_context
from task_errors import bad_input_fails_fast
from worker_queues import CPU_QUEUE

log = logging.getLogger(__name__)


@task.short_circuit
def source_changed(config: dict) -> str | bool:
    """The data fingerprint if no complete shard set has it yet under output_root, else False (the
    rest of the refresh is skipped: nothing written, no asset event, no training triggered)."""
    from mlm_tasks.data.shard_set import data_fingerprint, is_complete

    cfg, _ = step_context(config)
    with bad_input_fails_fast():
        fingerprint = data_fingerprint(cfg)
    if is_complete(cfg, fingerprint):
        log.info("Source unchanged: data fingerprint %s is already prepared under %s. Nothing to build and no "
                 "asset event, so no training run is triggered.", fingerprint, cfg.output_root)
        return False
    log.info("Source changed: no complete shard set for data fingerprint %s under %s; building it.",
             fingerprint, cfg.output_root)
    return fingerprint


@task(queue=CPU_QUEUE, execution_timeout=timedelta(hours=12))
def plan_shards(config: dict, **context: Any) -> list[dict]:
    """The partitions write_shards maps over. A run triggered by a dataset-refresh event uses exactly
    the announced set (never a re-fingerprint of a source that moved on)."""
    from mlm_tasks.data.shard_set import summary_for_fingerprint
    from mlm_tasks.steps.plan_shards import nothing_to_write
    from mlm_tasks.steps.plan_shards import plan_shards as step

    cfg, ctx = step_context(config)
    with bad_input_fails_fast():
        event = triggering_shards_event(context)
        if event:
            log.info("Triggered by dataset refresh: fingerprint %s under %s",
                     event["fingerprint"], event["output_root"])
            fingerprint = summary_for_fingerprint(cfg, event["fingerprint"])["fingerprint"]
            return list(nothing_to_write(fingerprint, cache_hit=True))
        return list(step(cfg, ctx))


@task(queue=CPU_QUEUE, execution_timeout=timedelta(hours=24), map_index_template="{{ partition_label }}")
def write_shards(config: dict, partition: dict) -> dict:
    """One mapped task per partition: its TFRecord shards and partial manifest."""
    from mlm_tasks.steps.write_shards import write_shards as step

    get_current_context()["partition_label"] = (  # the grid shows "partition 2 of 4", not a bare index
        f"partition {partition['part'] + 1} of {partition['num_parts']}" if partition["num_parts"]
        else "nothing to write")
    cfg, ctx = step_context(config, partition)
    with bad_input_fails_fast():
        return dict(step(cfg, ctx, part=partition["part"], num_parts=partition["num_parts"],
                         cache_hit=partition["cache_hit"], corpus_fingerprint=partition["corpus_fingerprint"]))


@task(queue=CPU_QUEUE)
def merge_shards(config: dict, written: list[dict], announce: bool = False, **context: Any) -> dict:
    """The merged, published shard set. In mlm_pretrain, then the run is checked against the data
    (batch vs records, the shards' max_length, an earlier checkpoint), still before any TPU VM exists;
    in mlm_dataset_refresh (`announce`), the SHARDS event's extra says exactly which data it is."""
    from mlm_tasks.steps.merge_shards import merge_shards as step
    from mlm_tasks.steps.validate import check_run_inputs

    first = list(written)[0]  # every partition carries the plan
    cfg, ctx = step_context(config, first)
    with bad_input_fails_fast():
        data = dict(step(cfg, ctx, cache_hit=first["cache_hit"], corpus_fingerprint=first["corpus_fingerprint"],
                         num_parts=first["num_parts"] or None))
        if not announce:
            check_run_inputs(cfg, ctx)
    if announce:
        context["outlet_events"][SHARDS].extra = event_extra(config, data)
        log.info("Announcing shards %s on asset %s: %s train records, %s train tokens", data["fingerprint"],
                 SHARDS.name, data["records"].get("train"), data["tokens"].get("train"))
    return data


def shard_set(config: Any, *, announce: bool = False, after: Any = None) -> Any:
    """The three tasks, wired (after `after`, e.g. the refresh's short-circuit, so its skip reaches
    them); merge_shards' XComArg (the data summary). Task ids are the step names."""
    with TaskGroup("shard_set", prefix_group_id=False,
                   tooltip="plan, write (per partition), merge the TFRecord shards"):
        plan = plan_shards(config)
        if after is not None:
            after >> plan
        written = write_shards.partial(config=config).expand(partition=plan)
        merge = merge_shards.override(outlets=[SHARDS] if announce else [])
        return merge(config, written, announce=announce)
