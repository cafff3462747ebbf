"""
### mlm_tpu_janitor: delete TPU VMs whose time is up

Every TPU VM the pipeline makes is named `mlm-...` and labelled `expires=<epoch seconds>`
(`tpu.ttl_hours` after creation). Teardown tasks delete the VM when a run ends, but a killed
scheduler, a cleared run or a crash can skip them; this DAG is the safety net. Hourly, it lists the
nodes in every zone of `zones` of one project, and in every (project, zone) where the deployment's
TPU registry (`MLM_TPU_REGISTRY`, written by the create task) says it made a node; it deletes those
named `mlm-*` whose `expires` label is in the past, and logs each one. Nodes without the label, or
not named `mlm-*`, are never touched. A zone whose listing fails, or a node whose delete the API
refuses (403, 500), does not stop the others; the task fails at the end, naming every such zone and node.
`forget_gone_nodes` then drops the registry entries of nodes that are gone. The sweep itself is
`mlm_tasks.tpu.registry` (delete_expired, forget_gone), with no Airflow in it.
Unconfigured (no project, or no `MLM_TPU_REGISTRY`) it fails, saying what to set: a janitor that
skips in green would leave VMs billing unseen.

The project, the GCP connection and the TPU API endpoint are deployment settings: the deployment
file's (`MLM_DEPLOYMENT`), else the environment's (`MLM_TPU_PROJECT`, `MLM_GCP_CONN_ID`,
`MLM_TPU_API_ENDPOINT`, `MLM_TPU_TRANSPORT`); a trigger can only add `zones` to look in (default
`MLM_TPU_ZONES` comma-separated, else `MLM_TPU_ZONE`). The TPU API is called with the credentials
of the Airflow GCP connection. By hand:
`airflow dags test mlm_tpu_janitor -c '{"zones": ["us-central2-b", "europe-west4-a"]}'`.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from mlm_airflow.defaults import default_args

DEFAULT_ZONES = [
    z.strip()
    for z in (os.environ.get("MLM_TPU_ZONES") or os.environ.get("MLM_TPU_ZONE") or "us-central2-b").split(",")
    if z.strip()
]


@dag(
    dag_id="mlm_tpu_janitor",
    schedule="@hourly",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["mlm", "tpu", "cleanup"],
    # The API may be briefly unavailable; the next hourly run is the real retry. MLM_RETRY_DELAY_S, as
    # for every DAG, lets tests and local runs retry at once.
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
)
def mlm_tpu_janitor() -> None:
    # The sweep is mlm_tasks/tpu/registry.py (no Airflow); the deployment's settings, mlm_tasks.config.deployment.
    @task
    def delete_expired(**context: Any) -> list[str]:
        from airflow.sdk.exceptions import AirflowException

        from mlm_airflow.connections import use_connection
        from mlm_airflow.errors import bad_input_fails_fast
        from mlm_tasks.config.deployment import janitor_api
        from mlm_tasks.tpu import registry

        with bad_input_fails_fast():  # unconfigured: fails without retries, saying what to set
            api, conn_id = janitor_api()  # the deployment's, never a conf's
            root = registry.location()
        with use_connection(conn_id):
            sweep = registry.delete_expired(api, context["params"]["zones"], root)
        problems = sweep.problems(conn_id)
        if problems:
            raise AirflowException(problems)
        return sweep.deleted

    @task  # a teardown (below): it runs after a failed delete_expired too, and leaves the run's state to it
    def forget_gone_nodes() -> list[str]:
        from mlm_airflow.connections import use_connection
        from mlm_airflow.errors import bad_input_fails_fast
        from mlm_tasks.config.deployment import janitor_api
        from mlm_tasks.tpu import registry

        with bad_input_fails_fast():
            api, conn_id = janitor_api()
            root = registry.location()
        with use_connection(conn_id):
            return registry.forget_gone(api, root)

    # As a teardown, forget_gone_nodes does not decide the run's state: a refused delete stays a red run.
    delete_expired() >> forget_gone_nodes().as_teardown()


mlm_tpu_janitor()
