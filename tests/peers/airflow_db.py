"""Read the test Airflow's SQLite metadata DB directly, to check what runs left behind.

    rows = db_rows(airflow_env, "SELECT extra FROM asset_event WHERE id > ?", last_id)
    events = asset_events(airflow_env, "mlm_shards")     # [{"id", "extra": dict, "source_dag_id", ...}]

Plain sqlite3 and read-only: tests look at the same tables the UI and the scheduler read (asset_event,
asset_dag_run_queue, dag_run, task_instance, xcom) without importing Airflow into the test process.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def db_path(env: dict[str, str]) -> Path:
    url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if url:
        assert url.startswith("sqlite:///"), f"these helpers read SQLite only, not {url.split(':')[0]}"
        return Path(url[len("sqlite:///") :])
    return Path(env["AIRFLOW_HOME"]) / "airflow.db"


def db_rows(env: dict[str, str], sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db_path(env)}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def asset_events(env: dict[str, str], asset_name: str) -> list[dict]:
    rows = db_rows(
        env,
        "SELECT e.id, e.extra, e.source_dag_id, e.source_run_id, e.source_task_id "
        "FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
        asset_name,
    )
    return [
        {
            "id": r[0],
            "extra": json.loads(r[1] or "{}"),
            "source_dag_id": r[2],
            "source_run_id": r[3],
            "source_task_id": r[4],
        }
        for r in rows
    ]


def xcom_values(env: dict[str, str], dag_id: str, run_id: str | None = None) -> dict[str, object]:
    """{task_id: value} of the return values of one run (the latest run of the DAG when run_id is None)."""
    if run_id is None:
        run_id = db_rows(env, "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", dag_id)[0][0]
    rows = db_rows(
        env, "SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'", dag_id, run_id
    )
    # The value column is JSON text, but SQLite's column affinity hands a bare number back as an int.
    return {task: json.loads(value) if isinstance(value, (str, bytes)) else value for task, value in rows}


def task_states(env: dict[str, str], dag_id: str, run_id: str | None = None) -> dict[str, str]:
    if run_id is None:
        run_id = db_rows(env, "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", dag_id)[0][0]
    return dict(
        db_rows(env, "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
    )
