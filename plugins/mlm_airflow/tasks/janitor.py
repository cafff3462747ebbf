"""The TPU janitor's tasks (dags/mlm_tpu_janitor.py) around mlm_tasks/tpu/registry.py's sweep; the project,
connection and API endpoint are the deployment's (`janitor_api`), never a trigger's.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import task

from mlm_airflow.connections import use_connection
from mlm_airflow.tasks.step_context import bad_input_fails_fast


def _deployment() -> tuple[Any, str, str]:
    """(TPU API, GCP connection id, registry root); unconfigured: fails without retries, saying what to set."""
    from mlm_tasks.config.deployment import janitor_api
    from mlm_tasks.tpu import registry

    with bad_input_fails_fast():
        api, conn_id = janitor_api()
        return api, conn_id, registry.location()


@task
def delete_expired(**context: Any) -> list[str]:
    """Delete `mlm-*` nodes whose `expires` label has passed, in the `zones` param and every recorded place;
    fails at the end, naming each zone and node the API refused (the others are still swept)."""
    from airflow.sdk.exceptions import AirflowException

    from mlm_tasks.tpu import registry

    api, conn_id, root = _deployment()
    with use_connection(conn_id):
        sweep = registry.delete_expired(api, context["params"]["zones"], root)
    problems = sweep.problems(conn_id)
    if problems:
        raise AirflowException(problems)
    return sweep.deleted


@task  # a teardown in the DAG: it runs after a failed delete_expired too, and leaves the run's state to it
def forget_gone_nodes() -> list[str]:
    """Drop the registry entries of nodes that are gone."""
    from mlm_tasks.tpu import registry

    api, conn_id, root = _deployment()
    with use_connection(conn_id):
        return registry.forget_gone(api, root)
