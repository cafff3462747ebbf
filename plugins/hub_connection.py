"""The Hugging Face Hub connection: the token and endpoint that publishing and checkpoint sync use.

    from hub_connection import hub_credentials      # Airflow puts plugins/ on sys.path
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)

The token is the connection's password, the endpoint its host (empty: huggingface.co, or HF_ENDPOINT).
Callers hand the token to `mlm_tasks` as an argument (or, to a TPU VM, in the SSH session's
environment): never through this process's environment, a log, XCom or a file.
"""
from __future__ import annotations


def hub_credentials(conn_id: str) -> tuple[str, str | None]:
    """Token (connection password) and optional endpoint (connection host) of the Hub connection."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowFailException

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # the SDK raises its own not-found type
        raise AirflowFailException(f"No Airflow connection {conn_id!r}: create it with the Hub token as "
                                   "password (see README, 'Publishing').") from None
    if not conn.password:
        raise AirflowFailException(f"Airflow connection {conn_id!r} has no password: put the Hub token there.")
    return conn.password, (conn.host or None)
