"""The Hugging Face Hub token and endpoint of an Airflow connection (password = token, host = endpoint).

    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)

Tasks pass them to the step as arguments: never in os.environ, a log or XCom.
"""
from __future__ import annotations


def hub_credentials(conn_id: str) -> tuple[str, str | None]:
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
