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
`forget_gone_nodes` then drops the registry entries of nodes that are gone.
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

import logging
import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task

from mlm_airflow.defaults import default_args

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
        "zones": Param(DEFAULT_ZONES, type="array", items={"type": "string"}, minItems=1,
                       description="Zones whose TPU VMs are checked (every zone runs may use)."),
    },
)
def mlm_tpu_janitor():
    @task
    def delete_expired(**context) -> list[str]:
        from airflow.sdk.exceptions import AirflowException
        from google.api_core.exceptions import GoogleAPICallError

        from mlm_airflow.connections import use_connection
        from mlm_tasks.config import TpuConfig
        from mlm_tasks.tpu import api as tpu
        from mlm_tasks.tpu import registry as tpu_registry

        log = logging.getLogger("airflow.task")
        params = {**context["params"], **_deployment()}  # the deployment wins over a conf
        registry = _configured_registry(params)
        deleted, failed, undeleted = [], [], []
        with use_connection(params["gcp_conn_id"]):
            places = tpu_registry.places_to_check(params["project"], params["zones"], tpu_registry.entries(registry))
            for project, zone in places:
                cfg = TpuConfig(project=project, zone=zone, transport=params["transport"],
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

    @task  # a teardown (below): it runs after a failed delete_expired too, and leaves the run's state to it
    def forget_gone_nodes(**context) -> list[str]:
        from google.api_core.exceptions import GoogleAPICallError

        from mlm_airflow.connections import use_connection
        from mlm_tasks.config import TpuConfig
        from mlm_tasks.tpu import api as tpu
        from mlm_tasks.tpu import registry as tpu_registry

        log, params = logging.getLogger("airflow.task"), {**context["params"], **_deployment()}
        registry = _configured_registry(params)
        forgotten = []
        with use_connection(params["gcp_conn_id"]):
            for entry in tpu_registry.entries(registry):
                cfg = TpuConfig(project=entry.project, zone=entry.zone, transport=params["transport"],
                                api_endpoint=params["api_endpoint"] or None)
                try:
                    state = tpu.get_state(cfg, entry.name).state
                except GoogleAPICallError as err:  # kept, and looked at again next hour
                    log.warning("Cannot check TPU VM %s in %s/%s: %s", entry.name, entry.project, entry.zone, err)
                    continue
                if state == tpu.NOT_FOUND:
                    tpu_registry.forget(registry, entry.project, entry.zone, entry.name)
                    forgotten.append(f"{entry.project}/{entry.zone}/{entry.name}")
        log.info("Forgot %d gone TPU VM(s) of the registry: %s", len(forgotten), forgotten)
        return forgotten

    # As a teardown, forget_gone_nodes does not decide the run's state: a refused delete stays a red run.
    delete_expired() >> forget_gone_nodes().as_teardown()


def _deployment() -> dict:
    """The project, GCP connection and TPU API endpoint: deployment settings (the deployment file's
    `settings`, else the environment), never a trigger's (mlm_tasks/deployment.py)."""
    from mlm_tasks.deployment import Deployment

    dep = Deployment.load()
    settings = dep.settings if dep else {}
    tpu = settings.get("tpu", {})
    return {"project": tpu.get("project") or os.environ.get("MLM_TPU_PROJECT", ""),
            "gcp_conn_id": settings.get("gcp_conn_id") or os.environ.get("MLM_GCP_CONN_ID", "google_cloud_default"),
            "api_endpoint": tpu.get("api_endpoint") or os.environ.get("MLM_TPU_API_ENDPOINT", ""),
            "transport": tpu.get("transport") or os.environ.get("MLM_TPU_TRANSPORT", "grpc")}


def _configured_registry(params) -> str:
    """The registry's location; fails (no retry: only a person can fix it) when the janitor is not set up."""
    from airflow.sdk.exceptions import AirflowFailException

    from mlm_tasks.errors import ConfigError
    from mlm_tasks.tpu import registry as tpu_registry

    if not params["project"]:
        raise AirflowFailException("The janitor has no project to check: set MLM_TPU_PROJECT (and MLM_TPU_ZONES) in "
                                   "the environment of the Airflow services, or tpu.project in the deployment file.")
    try:
        return tpu_registry.location()
    except ConfigError as err:
        raise AirflowFailException(str(err)) from None


mlm_tpu_janitor()
