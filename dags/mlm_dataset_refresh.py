"""
### mlm_dataset_refresh — rebuild tokenizer and shards when the corpus changed, and announce them

validate → source_changed (fingerprint the source: dataset id + config + revision, or file
hashes, plus every setting that changes the shards) → plan_shards → filters and dedup → train_tokenizer →
write_shards (TFRecord shards, one mapped task per corpus partition: set `shards.partitions` to fan a
large corpus out over the workers) → merge_shards (one merged manifest and `_SUCCESS` under
`<output_root>/datasets/<fingerprint>/`). The shard-set tasks are the same task group as in mlm_pretrain.

When a complete shard set with that fingerprint already exists, `source_changed` says so in its log
and skips the rest: nothing is written and no asset event is emitted. Otherwise
`merge_shards` emits an event on the `mlm_shards` asset whose extra carries the fingerprint, the
output_root, the data settings and the record/token counts; `mlm_pretrain` is scheduled on that
asset and trains on exactly that fingerprint.

**Schedule**: weekly by default; set the environment variable `MLM_REFRESH_SCHEDULE` of the
scheduler and dag-processor to a cron string (`0 3 * * 1`) or a preset (`@daily`), or to `none` for
manual runs only. The form's fields are those of `mlm_pretrain` (config file, output root and an
**overrides** object of dotted settings, e.g. `{"corpus.source": "local_files", "corpus.local_paths":
["/data/*.txt"]}`); scheduled runs use their defaults, so put the production settings in the config
file. Run by hand: `airflow dags test mlm_dataset_refresh -c '{"config_file": "configs/tiny.yaml"}'`.
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
    # TaskFlow: a task called here takes XComArgs (Airflow hands it their values at run time), but Airflow's stubs
    # type the call with the function's own parameters (apache/airflow#39514).
    shard_set(config, announce=True, after=source_changed(config))  # type: ignore[arg-type]
