"""The Hugging Face Hub connection: the token and endpoint that publishing and checkpoint sync use.

    from hub_connection import hub_credentials      # Airflow puts plugins/ on sys.path
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)

The token is the connection's password, the endpoint its host (empty: huggingface.co, or HF_ENDPOINT).
Callers hand the token to `mlm_tasks` as an argument (or, to a TPU VM, in the SSH session's
environment): never through this process's environment, a log, XCom or a file.

Errors follow mlm_tasks/errors.py: a connection that does not exist, has no password, or that the
secrets backend refuses to give this task fails the task without retries; any other failure of the
lookup (a secrets backend that is down or slow) is raised as it is, and retried. The task SDK itself
(airflow/sdk/execution_time/context.py) turns a backend that fails *inside* its lookup loop into
"not found" after logging it at debug level, so the not-found message says to look there.
"""
from __future__ import annotations


def hub_credentials(conn_id: str) -> tuple[str, str | None]:
    """Token (connection password) and optional endpoint (connection host) of the Hub connection."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSecretsBackendAccessDenied

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise AirflowFailException(f"No Airflow connection {conn_id!r}: create it with the Hub token as "
                                   "password (see docs/releases.md). If it exists, a secrets backend failed to "
                                   "answer (the task log says so at debug level): clear the task.") from None
    except AirflowSecretsBackendAccessDenied as err:  # an authoritative deny: a retry gets the same answer
        raise AirflowFailException(f"Airflow connection {conn_id!r} may not be read by this task ({err}): grant "
                                   "the DAG access to it, or set publish.hf_conn_id to one it may read.") from None
    if not conn.password:
        raise AirflowFailException(f"Airflow connection {conn_id!r} has no password: put the Hub token there.")
    return conn.password, (conn.host or None)
