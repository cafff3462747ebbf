"""Airflow callables of `mlm_dataset_refresh`: validate, check the source's fingerprint, build and announce.

    validate_source  -> the config as XCom; opens the corpus but writes nothing
    source_changed   -> ShortCircuitOperator callable: the new fingerprint, or False (nothing to do)
    plan_shards      -> trains the tokenizer; the partitions to write (shards.partitions of them)
    write_shards     -> one mapped task per partition: its shards and partial manifest
    build_shards     -> merges the partitions into manifest.json + _SUCCESS; attaches the SHARDS event's extra

An unchanged source must cost nothing and announce nothing: the first two tasks never write under
output_root, and the only task with `outlets=[SHARDS]` is skipped, so no asset event is recorded.
"""
from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.config import PipelineConfig, config_from_params
import shard_fanout
from task_errors import bad_input_fails_fast

log = logging.getLogger(__name__)


def _config(ti) -> PipelineConfig:
    """The refresh's config; gs:// clients of this task then use the run's GCP connection."""
    from gcp_credentials import install_for

    cfg = PipelineConfig.model_validate(ti.xcom_pull(task_ids="validate_source"))
    install_for(cfg)
    return cfg


def validate_source(params: dict, **_: Any) -> dict:
    from mlm_tasks.corpus import open_corpus
    from mlm_tasks.validate import check_output_root_reachable
    from worker_queues import distributed_executor, shared_output_roots

    with bad_input_fails_fast():
        cfg = config_from_params(params)
        # The mapped write_shards tasks may land on several machines: they must all see output_root.
        check_output_root_reachable(cfg.output_root, distributed_executor(), shared_output_roots())
        open_corpus(cfg.corpus)  # missing files and bad file types fail here, before any work
    log.info("Refreshing corpus %s into %s", cfg.corpus.source, cfg.output_root)
    return cfg.model_dump(mode="json")


def source_changed(ti, **_: Any) -> str | bool:
    """The data fingerprint if no complete shard set has it yet under output_root, else False."""
    from mlm_tasks import storage
    from mlm_tasks.paths import DataPaths
    from mlm_tasks.prepare import data_fingerprint

    cfg = _config(ti)
    with bad_input_fails_fast():
        paths = DataPaths(cfg.output_root, data_fingerprint(cfg))
    if storage.exists(paths.success):
        log.info("Source unchanged: data fingerprint %s is already prepared at %s. Nothing to build and no "
                 "asset event, so no training run is triggered.", paths.fingerprint, paths.shards_dir)
        return False
    log.info("Source changed: no complete shard set for data fingerprint %s under %s; building it.",
             paths.fingerprint, paths.root)
    return paths.fingerprint


def plan_shards(ti, **_: Any) -> list[dict]:
    """Tokenizer for the checked fingerprint; the partitions `write_shards` maps over."""
    from mlm_tasks.prepare import plan_data
    from mlm_tasks.validate import check_writable

    cfg = _config(ti)
    with bad_input_fails_fast():
        check_writable(cfg.output_root)
        plan = plan_data(cfg)
    checked = ti.xcom_pull(task_ids="source_changed")
    if plan["fingerprint"] != checked:
        # The files changed again between the check and now: build and announce what is there now.
        log.warning("The source changed while refreshing: checked fingerprint %s, building %s", checked,
                    plan["fingerprint"])
    return shard_fanout.hand_out(ti, plan)


def write_shards(part: int, num_parts: int, ti, **_: Any) -> dict:
    return shard_fanout.write_partition(_config(ti), ti, part, num_parts)


def build_shards(ti, outlet_events, **_: Any) -> dict:
    """Publish the merged shard set; the SHARDS event's extra says exactly which data it is."""
    from mlm_assets import SHARDS, event_extra
    from mlm_tasks.prepare import finish_data

    cfg = _config(ti)
    plan = shard_fanout.planned(ti)
    with bad_input_fails_fast():
        data = finish_data(cfg, plan["fingerprint"], plan["cache_hit"], plan["corpus_fingerprint"])
    extra = event_extra(cfg.model_dump(mode="json"), data)
    outlet_events[SHARDS].extra = extra
    log.info("Announcing shards %s on asset %s: %s train records, %s train tokens", data["fingerprint"],
             SHARDS.name, data["records"].get("train"), data["tokens"].get("train"))
    return data
