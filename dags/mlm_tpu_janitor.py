"""
### mlm_tpu_janitor — delete TPU VMs whose time is up

Hourly: `delete_expired` deletes the nodes named `mlm-*` whose `expires` label (`tpu.ttl_hours` after
creation or last reuse) has passed, in every zone of `zones` and every place the TPU registry
(`MLM_TPU_REGISTRY`) recorded; `forget_gone_nodes` drops the registry entries of nodes that are gone.
The safety net for VMs a killed scheduler or a cleared run left behind; never touches a node without
the label or not named `mlm-*`. Unconfigured, it fails saying what to set. docs/operations.md#the-tpu-janitor.
By hand: `airflow dags test mlm_tpu_janitor -c '{"zones": ["us-central2-b", "europe-west4-a"]}'`.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from mlm_airflow.defaults import default_args
from mlm_airflow.tasks.janitor import delete_expired, forget_gone_nodes

DEFAULT_ZONES = [
    z.strip()
    for z in (os.environ.get("MLM_TPU_ZONES") or os.environ.get("MLM_TPU_ZONE") or "us-central2-b").split(",")
    if z.strip()
]

with DAG(
    dag_id="mlm_tpu_janitor",
    description="Delete mlm-* TPU VMs whose expires label has passed.",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    # The next hourly run is the real retry; MLM_RETRY_DELAY_S lets tests and local runs retry at once.
    default_args={
        **default_args(),
        "retry_exponential_backoff": False,
        "retry_delay": timedelta(seconds=float(os.environ.get("MLM_RETRY_DELAY_S", 300))),
    },
    params={
        "zones": Param(
            DEFAULT_ZONES,
            type="array",
            items={"type": "string"},
            minItems=1,
            description="Zones whose TPU VMs are checked (every zone runs may use).",
        ),
    },
    tags=["mlm", "tpu", "cleanup"],
) as dag:
    # As a teardown, forget_gone_nodes does not decide the run's state: a refused delete stays a red run.
    delete_expired() >> forget_gone_nodes().as_teardown()
