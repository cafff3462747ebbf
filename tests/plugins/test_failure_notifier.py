"""Failure notification: a real task fails its last try under `airflow dags test`, and FailureNotifier
POSTs the alert to a real HTTP server on loopback (webhook from the environment, then from the
`mlm_alerts` connection); secrets in the error never reach the webhook."""

import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlm_airflow.notifications import scrub
from peers.airflow_home import dags_test

TOKEN = "hf_" + "Q" * 34
DAG_ID = "notifier_probe"
DAG_FILE = f'''
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from mlm_airflow.notifications import FailureNotifier

with DAG("{DAG_ID}", start_date=datetime(2026, 1, 1), schedule=None, catchup=False, tags=["test"],
         default_args={{"owner": "test", "retries": 1, "retry_delay": timedelta(seconds=0),
                       "on_failure_callback": [FailureNotifier()]}}):
    @task
    def doomed():
        raise RuntimeError("upload refused with token={TOKEN} for https://user:hunter2@hub.example/x")

    doomed()
'''


class _Webhook:
    def __init__(self):
        self.received: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(
                    {"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)}
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/T0/secret-path"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def webhook():
    hook = _Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture
def dagfile(tmp_path):
    path = tmp_path / "dags" / "notifier_probe.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(DAG_FILE))
    return path


def _check_alert(hook, log: str) -> dict:
    assert len(hook.received) == 1, log[-4000:]  # once: on the last try, not on the retry
    alert = hook.received[0]
    assert alert["path"] == "/hooks/T0/secret-path" and alert["type"] == "application/json"
    body = alert["body"]
    assert set(body) == {"dag_id", "run_id", "task_id", "try_number", "max_tries", "log_url", "exception"}
    assert body["dag_id"] == DAG_ID and body["task_id"] == "doomed" and body["run_id"]
    assert body["try_number"] == 2 and body["max_tries"] == 1
    assert body["log_url"].startswith(f"http://airflow.example:8080/dags/{DAG_ID}/runs/")
    assert "/tasks/doomed" in body["log_url"] and body["log_url"].endswith("try_number=2")
    assert body["exception"].startswith("RuntimeError: upload refused with token=***")
    assert TOKEN not in json.dumps(body) and "hunter2" not in json.dumps(body)
    assert "secret-path" not in log  # the webhook's own secret stays out of the task log
    return body


@pytest.mark.slow
def test_failed_task_posts_alert_to_webhook_from_env(airflow_env, dagfile, webhook):
    result = dags_test(
        airflow_env,
        DAG_ID,
        dagfile=dagfile,
        extra_env={"MLM_ALERT_WEBHOOK_URL": webhook.url, "AIRFLOW__API__BASE_URL": "http://airflow.example:8080"},
    )
    log = result.stdout + result.stderr
    assert "new_state=up_for_retry" in log and "state=failed" in log, log[-4000:]
    body = _check_alert(webhook, log)
    assert "Task failed: notifier_probe.doomed" in log and f"run {body['run_id']}, try 2 of 2" in log
    assert "Failure alert sent to http://127.0.0.1 (HTTP 204)" in log


@pytest.mark.slow
def test_webhook_from_the_mlm_alerts_connection(airflow_env, dagfile, webhook):
    conn = json.dumps({"conn_type": "http", "host": webhook.url})
    result = dags_test(
        airflow_env,
        DAG_ID,
        dagfile=dagfile,
        extra_env={"AIRFLOW_CONN_MLM_ALERTS": conn, "AIRFLOW__API__BASE_URL": "http://airflow.example:8080"},
    )
    _check_alert(webhook, result.stdout + result.stderr)


def test_scrub_removes_token_shaped_strings():
    text = (
        f"token={TOKEN} Authorization: Bearer abcdefgh12345 ya29.a0AfB_xyz password: s3cret "
        "gs://b/p https://u:pw@h/x -----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY----- KeyError: 'x'"
    )
    clean = scrub(text)
    for secret in (TOKEN, "abcdefgh12345", "ya29.a0AfB_xyz", "s3cret", ":pw@", "MIIE"):
        assert secret not in clean, (secret, clean)
    assert "gs://b/p" in clean and "KeyError: 'x'" in clean and "https://u:***@h/x" in clean


def test_every_project_dag_notifies_on_failure():
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    from mlm_airflow.notifications import FailureNotifier

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert {"mlm_pretrain", "mlm_tpu_janitor"} <= set(bag.dags)
    for dag_id, dag in bag.dags.items():
        for task in dag.tasks:
            assert any(isinstance(cb, FailureNotifier) for cb in task.on_failure_callback or []), (dag_id, task.task_id)
