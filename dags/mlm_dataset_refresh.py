"""
### mlm_dataset_refresh — rebuild tokenizer and shards when the corpus changed, and announce them

validate → source_changed (fingerprint the source and every setting that changes the shards) → the shard-set
tasks of mlm_pretrain (plan_shards, filters and dedup, train_tokenizer, write_shards per partition,
merge_shards). An unchanged source skips the rest: nothing written, no event. Otherwise `merge_shards` emits
an event on the `mlm_shards` asset (fingerprint, output_root, data settings, counts), on which
`mlm_pretrain` is scheduled: it trains on exactly that fingerprint.

**Schedule**: weekly; `MLM_REFRESH_SCHEDULE` (scheduler and dag-processor) sets a cron string, a preset or
`none`. Scheduled runs use the form's defaults, so put production settings in the config file
(docs/releases.md). By hand: `airflow dags test mlm_dataset_refresh -c '{"config_file": "configs/tiny.yaml"}'`.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from mlm_airflow.defaults import config_params, default_args, default_config
from mlm_airflow.tasks.shard_set import shard_set, source_changed
from mlm_airflow.tasks.steps import validate

_defaults = default_config()
_schedule = os.environ.get("MLM_REFRESH_SCHEDULE", "@weekly").strip()
SCHEDULE = None if _schedule.lower() in ("", "none") else _schedule

params = config_params(
    _defaults, "Local folder or gs://bucket/prefix where the datasets are kept.", '{"corpus.hf_revision": "abc123"}'
)

with DAG(
    dag_id="mlm_dataset_refresh",
    description="Fingerprint the corpus; when it changed, build tokenizer + shards and announce them.",
    doc_md=__doc__,
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Two refreshes of one source would build the same shard set twice and announce it twice.
    max_active_runs=1,
    default_args=default_args(),
    params=params,
    tags=["mlm", "data"],
) as dag:
    config = validate(probe_write=False)  # an unchanged source writes nothing (plan_shards probes output_root)
    # Airflow's stubs type a TaskFlow call with run-time values, not XComArgs (apache/airflow#39514).
    shard_set(config, announce=True, after=source_changed(config))  # type: ignore[arg-type]
