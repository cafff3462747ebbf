"""
### mlm_tpu_janitor: delete TPU VMs whose time is up

Every TPU VM the pipeline makes is named `mlm-...` and labelled `expires=<epoch seconds>`
(`tpu.ttl_hours` after creation). Teardown tasks delete the VM when a run ends, but a killed
scheduler, a cleared run or a crash can skip them; this DAG is the safety net. Hourly, it lists the
nodes in one project/zone, deletes those named `mlm-*` whose `expires` label is in the past, and
logs each one. Nodes without the label, or not named `mlm-*`, are never touched.

Params default to the environment (`MLM_TPU_PROJECT`, `MLM_TPU_ZONE`, `MLM_TPU_API_ENDPOINT`,
`MLM_TPU_TRANSPORT`) so scheduled runs need no trigger form. Run by hand:
`airflow dags test mlm_tpu_janitor -c '{"project": "my-project", "zone": "us-central2-b"}'`.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from dag_defaults import default_args


@dag(
    dag_id="mlm_tpu_janitor",
    schedule="@hourly",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["mlm", "tpu", "cleanup"],
    # The API may be briefly unavailable; the next hourly run is the real retry.
    default_args={**default_args(), "retry_delay": timedelta(minutes=5), "retry_exponential_backoff": False},
    params={
        "project": Param(os.environ.get("MLM_TPU_PROJECT", ""), type="string",
                         description="Google Cloud project whose TPU VMs are checked."),
        "zone": Param(os.environ.get("MLM_TPU_ZONE", "us-central2-b"), type="string",
                      description="Zone of the TPU VMs."),
        "api_endpoint": Param(os.environ.get("MLM_TPU_API_ENDPOINT", ""), type="string",
                              description="TPU API endpoint override (empty: the real API)."),
        "transport": Param(os.environ.get("MLM_TPU_TRANSPORT", "grpc"), enum=["grpc", "rest"],
                           description="TPU API client transport."),
    },
)
def mlm_tpu_janitor():
    @task
    def delete_expired(**context) -> list[str]:
        from airflow.sdk.exceptions import AirflowSkipException

        from mlm_tasks import tpu
        from mlm_tasks.config import TpuConfig

        log = logging.getLogger("airflow.task")
        params = context["params"]
        if not params["project"]:
            raise AirflowSkipException("No project: set the `project` param or MLM_TPU_PROJECT.")
        cfg = TpuConfig(project=params["project"], zone=params["zone"], transport=params["transport"],
                        api_endpoint=params["api_endpoint"] or None)
        deleted = []
        for node in tpu.list_expired(cfg):
            expired = pendulum.from_timestamp(int(node.labels["expires"])).to_iso8601_string()
            log.info("Deleting TPU VM %s (%s, run %s, expired %s).", node.name, node.state,
                     node.labels.get("run", "?"), expired)
            tpu.delete_node(cfg, node.name)
            deleted.append(node.name)
        log.info("Deleted %d expired TPU VM(s) in %s/%s: %s", len(deleted), cfg.project, cfg.zone, deleted)
        return deleted

    delete_expired()


mlm_tpu_janitor()
