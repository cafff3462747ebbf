"""
### mlm_tpu_janitor: delete TPU VMs whose time is up

Every TPU VM the pipeline makes is named `mlm-...` and labelled `expires=<epoch seconds>`
(`tpu.ttl_hours` after creation). Teardown tasks delete the VM when a run ends, but a killed
scheduler, a cleared run or a crash can skip them; this DAG is the safety net. Hourly, it lists the
nodes in every zone of `zones` of one project, deletes those named `mlm-*` whose `expires` label is
in the past, and logs each one. Nodes without the label, or not named `mlm-*`, are never touched. A
zone whose listing fails, or a node whose delete the API refuses (403, 500), does not stop the others;
the task fails at the end, naming every such zone and node.

Params default to the environment (`MLM_TPU_PROJECT`, `MLM_TPU_ZONES` comma-separated, else
`MLM_TPU_ZONE`, `MLM_TPU_API_ENDPOINT`, `MLM_TPU_TRANSPORT`, `MLM_GCP_CONN_ID`) so scheduled runs need
no trigger form. The TPU API is called with the credentials of the Airflow GCP connection. By hand:
`airflow dags test mlm_tpu_janitor -c '{"project": "my-project", "zones": ["us-central2-b", "europe-west4-a"]}'`.
"""
from __future__ import annotations

import logging
import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from dag_defaults import default_args

DEFAULT_ZONES = [z.strip() for z in (os.environ.get("MLM_TPU_ZONES") or os.environ.get("MLM_TPU_ZONE")
                                     or "us-central2-b").split(",") if z.strip()]


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
    default_args={**default_args(), "retry_exponential_backoff": False,
                  "retry_delay": timedelta(seconds=float(os.environ.get("MLM_RETRY_DELAY_S", 300)))},
    params={
        "project": Param(os.environ.get("MLM_TPU_PROJECT", ""), type="string",
                         description="Google Cloud project whose TPU VMs are checked."),
        "zones": Param(DEFAULT_ZONES, type="array", items={"type": "string"}, minItems=1,
                       description="Zones whose TPU VMs are checked (every zone runs may use)."),
        "gcp_conn_id": Param(os.environ.get("MLM_GCP_CONN_ID", "google_cloud_default"), type="string",
                             description="Airflow GCP connection whose credentials call the TPU API."),
        "api_endpoint": Param(os.environ.get("MLM_TPU_API_ENDPOINT", ""), type="string",
                              description="TPU API endpoint override (empty: the real API)."),
        "transport": Param(os.environ.get("MLM_TPU_TRANSPORT", "grpc"), enum=["grpc", "rest"],
                           description="TPU API client transport."),
    },
)
def mlm_tpu_janitor():
    @task
    def delete_expired(**context) -> list[str]:
        from airflow.sdk.exceptions import AirflowException, AirflowSkipException
        from google.api_core.exceptions import GoogleAPICallError

        from gcp_credentials import use_connection
        from mlm_tasks import tpu
        from mlm_tasks.config import TpuConfig

        log = logging.getLogger("airflow.task")
        params = context["params"]
        if not params["project"]:
            raise AirflowSkipException("No project: set the `project` param or MLM_TPU_PROJECT.")
        deleted, failed, undeleted = [], [], []
        with use_connection(params["gcp_conn_id"]):
            for zone in params["zones"]:
                cfg = TpuConfig(project=params["project"], zone=zone, transport=params["transport"],
                                api_endpoint=params["api_endpoint"] or None)
                try:
                    expired_nodes = tpu.list_expired(cfg)
                except GoogleAPICallError as err:  # one zone's trouble must not spare the others' VMs
                    log.error("Cannot list TPU VMs in %s/%s: %s", cfg.project, zone, err)
                    failed.append(zone)
                    continue
                for node in expired_nodes:
                    expired = pendulum.from_timestamp(int(node.labels["expires"])).to_iso8601_string()
                    log.info("Deleting TPU VM %s in %s (%s, run %s, expired %s).", node.name, zone, node.state,
                             node.labels.get("run", "?"), expired)
                    try:
                        tpu.delete_node(cfg, node.name)
                    except GoogleAPICallError as err:  # one refused node must not spare the others
                        log.error("Cannot delete TPU VM %s in %s/%s: %s", node.name, cfg.project, zone, err)
                        undeleted.append(f"{zone}/{node.name}")
                        continue
                    deleted.append(f"{zone}/{node.name}")
        log.info("Deleted %d expired TPU VM(s) in %s %s: %s", len(deleted), params["project"], params["zones"],
                 deleted)
        problems = []
        if failed:
            problems.append(f"Could not list TPU VMs in zone(s) {failed}: check the zone names and that "
                            f"connection {params['gcp_conn_id']!r} may list TPU nodes (roles/tpu.admin).")
        if undeleted:
            problems.append(f"Could not delete TPU VM(s) {undeleted} (they still cost money): check that "
                            f"connection {params['gcp_conn_id']!r} may delete TPU nodes (roles/tpu.admin), or "
                            "delete them by hand with `gcloud compute tpus tpu-vm delete NAME --zone ZONE`.")
        if problems:
            raise AirflowException(" ".join(problems))
        return deleted

    delete_expired()


mlm_tpu_janitor()
