"""mlm_pretrain on the real services (PostgreSQL, api-server, scheduler, dag-processor, triggerer),
driven only through the public REST API v2, as an operator's script would.

    .venv/bin/python -m pytest tests/deploy/test_stack_e2e.py

One run, `rest-fault`, changes a param (steps=10) and must honour it, and meets a fault at step 6 (a
FailAtStep hook the stack's environment names for that run: tests/deploy/conftest.py): try 2 of `train`
succeeds, resumed from the checkpoint. (Two runs did this once, one each; a tiny run costs ~2 CPU-minutes
on CI's two cores, and one run shows both.)

On the same stack (one start), the deployment's safety: the FAB roles through the real api-server
(Admin triggers, a Viewer is refused; a User cannot create a connection, an Op can), the Celery result
backend's own PostgreSQL role (no access to the metadata DB). Which service holds which secret is
checked on the compose file (test_compose.py): /proc/<pid>/environ cannot tell, as Airflow's
setproctitle overwrites that memory with the process title.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from mlm_tasks.paths import safe_run_id
from peers.airflow_stack import data_volume
from peers.tiny_data import TINY_FORM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = "mlm_pretrain"
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def runs(airflow_stack, airflow_api, tiny_prepared) -> dict[str, dict]:
    """The run, triggered once: {"param": {"run_id", "output_root", "conf"}}. Its output_root holds the tiny shard
    set already (plan_shards finds it complete; the data tasks on this stack: test_browser.py's run)."""
    # run `rest-fault`: the stack's MLM_TRAIN_HOOKS fails its first try at step 6
    output_root = data_volume(airflow_stack) / "out-param"  # where runs write
    shutil.copytree(Path(tiny_prepared[0].output_root) / "datasets", output_root / "datasets")
    conf = {**TINY_FORM, "steps": 10, "output_root": str(output_root)}
    run = airflow_api.trigger(DAG_ID, conf=conf, run_id="rest-fault")
    assert run["state"] == "queued" and run["conf"] == conf, run
    return {"param": {"run_id": run["dag_run_id"], "output_root": conf["output_root"], "conf": conf}}


def _finished(api, run: dict) -> dict:
    done = api.wait_for_run(DAG_ID, run["run_id"], timeout=RUN_TIMEOUT_S)
    assert done["state"] == "success", f"run {run['run_id']} ended {done['state']}:\n" + api.explain(
        DAG_ID, run["run_id"]
    )
    return done


def _run_dir(run: dict) -> Path:
    return Path(run["output_root"]) / "runs" / safe_run_id(run["run_id"])


def test_rest_triggered_run_honours_changed_param_and_try_2_resumes_after_a_fault(airflow_api, runs):
    run = runs["param"]
    done = _finished(airflow_api, run)
    assert done["conf"]["steps"] == 10 and done["run_type"] == "manual"

    # The validated config the tasks ran with (XCom of validate) carries the new value...
    xcom = airflow_api.get(
        f"/dags/{DAG_ID}/dagRuns/{run['run_id']}/taskInstances/validate/xcomEntries/return_value", deserialize=True
    )
    config = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert config["train"]["steps"] == 10 and config["output_root"] == run["output_root"]

    # ...and so do the artifacts: 10 steps trained, the rest of the pipeline wrote its outputs.
    run_dir = _run_dir(run)
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "train" / "history.jsonl").read_text().splitlines()]
    assert history and history[-1]["step"] == 10
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["masked_tokens"] > 0 and metrics["perplexity"] > 1
    predictions = json.loads((run_dir / "infer" / "predictions.json").read_text())
    assert predictions and predictions[0]["predictions"]
    assert (run_dir / "model" / "config.json").is_file()

    states = {
        ti["task_id"]: ti["state"]
        for ti in airflow_api.get(f"/dags/{DAG_ID}/dagRuns/{run['run_id']}/taskInstances")["task_instances"]
    }
    assert states["train"] == states["evaluate"] == states["summary"] == "success", states
    assert states["write_shards"] == "skipped", states  # the set was there: nothing to write

    # The fault: try 1 of train failed at step 6, try 2 succeeded, resumed from the last checkpoint before it
    # (checkpoint_every: 5 in tiny.yaml).
    train = airflow_api.task_instance(DAG_ID, run["run_id"], "train")
    assert train["state"] == "success" and train["try_number"] == 2, train
    tries = {t["try_number"]: t["state"] for t in airflow_api.tries(DAG_ID, run["run_id"], "train")}
    assert tries == {1: "failed", 2: "success"}, tries
    first_log = airflow_api.log(DAG_ID, run["run_id"], "train", 1)
    assert "Injected fault at step 6" in first_log, first_log[-3000:]
    assert summary["resumed_from_step"] == 5 and summary["steps"] == 10, summary


# --- safe by default: roles, the result backend's role --------------------------------------------


def _as(stack, username: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{stack.url}/api/v2", timeout=60, headers={"Authorization": f"Bearer {stack.token_for(username)}"}
    )


def test_viewer_cannot_trigger_a_run_admin_can(airflow_stack, airflow_api, runs):
    # Admin: the runs above were triggered with admin's token (POST .../dagRuns → queued).
    assert airflow_api.run(DAG_ID, runs["param"]["run_id"])["run_type"] == "manual"
    viewer = _as(airflow_stack, "viewer")
    assert viewer.get(f"/dags/{DAG_ID}").status_code == 200  # a Viewer sees the DAG...
    body = {"dag_run_id": "viewer-try", "logical_date": None, "conf": runs["param"]["conf"]}
    refused = viewer.post(f"/dags/{DAG_ID}/dagRuns", json=body)
    assert refused.status_code == 403, refused.text  # ...and cannot run it
    assert viewer.patch(f"/dags/{DAG_ID}", json={"is_paused": True}).status_code == 403
    assert airflow_api.client.get(f"/dags/{DAG_ID}/dagRuns/viewer-try").status_code == 404
    assert airflow_api.get(f"/dags/{DAG_ID}")["is_paused"] is False
    # No token, or a wrong password: nothing.
    assert httpx.get(f"{airflow_stack.url}/api/v2/dags", timeout=30).status_code == 401
    wrong = httpx.post(f"{airflow_stack.url}/auth/token", json={"username": "admin", "password": "wrong"}, timeout=30)
    assert wrong.status_code == 401, wrong.text


def test_a_rest_conf_cannot_set_a_deployment_setting(airflow_stack, airflow_api, runs):
    """Through the real api-server, as an admin even: the conf's tpu.api_endpoint (which would receive
    the GCP connection's token) is refused by validate under the stack's deployment file, without
    retries, and nothing after validate runs."""
    conf = {
        **runs["param"]["conf"],
        "output_root": str(data_volume(airflow_stack) / "out-boundary"),
        "overrides": {"tpu.api_endpoint": "http://attacker.example"},
    }
    run = airflow_api.trigger(DAG_ID, conf=conf, run_id="rest-boundary")
    done = airflow_api.wait_for_run(DAG_ID, run["dag_run_id"], timeout=RUN_TIMEOUT_S)
    assert done["state"] == "failed"
    validate = airflow_api.task_instance(DAG_ID, run["dag_run_id"], "validate")
    assert validate["state"] == "failed" and validate["try_number"] == 1
    log = airflow_api.log(DAG_ID, run["dag_run_id"], "validate", 1)
    assert "tpu.api_endpoint is a deployment setting: the trigger's settings may not set it" in log, log[-3000:]
    assert "-deployment-airflow-scheduler.yaml" in log  # names where the deployment sets it
    assert not (data_volume(airflow_stack) / "out-boundary").exists()


def test_a_trainer_triggers_runs_but_cannot_release_mark_or_send_events(airflow_stack, airflow_api, runs):
    """deploy/fab-roles.py's Trainer: Viewer + trigger mlm_pretrain. FAB's User may also create Asset events, mark task
    instances and answer HITL tasks; a Trainer none of these."""
    trainer = _as(airflow_stack, "trainer")
    run_id = runs["param"]["run_id"]
    assert trainer.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").status_code == 200
    # Refused by role before any body is looked at: an event, a mark, an answer, a pause.
    event = trainer.post("/assets/events", json={"asset_id": 1, "extra": {"fingerprint": "0" * 16}})
    assert event.status_code == 403, event.text
    ti = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/validate"
    assert trainer.patch(ti, json={"new_state": "success"}).status_code == 403
    hitl = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approve_release/-1/hitlDetails"
    assert trainer.patch(hitl, json={"chosen_options": ["Approve"]}).status_code == 403
    assert trainer.delete(f"/dags/{DAG_ID}").status_code == 403
    refresh = trainer.post("/dags/mlm_dataset_refresh/dagRuns", json={"logical_date": None})
    assert refresh.status_code == 403, refresh.text  # the edit it needs to trigger is on mlm_pretrain alone
    # It may trigger (a conf validate refuses at once, so the run costs nothing), not stop a run.
    made = trainer.post(
        f"/dags/{DAG_ID}/dagRuns",
        json={"dag_run_id": "trainer-run", "logical_date": None, "conf": {"output_root": "/etc/mlm"}},
    )
    assert made.status_code == 200, made.text
    assert trainer.patch(f"/dags/{DAG_ID}/dagRuns/trainer-run", json={"state": "failed"}).status_code == 403
    assert airflow_api.wait_for_run(DAG_ID, "trainer-run", timeout=RUN_TIMEOUT_S)["state"] == "failed"


def test_a_rest_made_shards_event_schedules_a_run_that_refuses_it(airflow_stack, airflow_api):
    """FAB's User may POST an Asset event; mlm_pretrain is scheduled on mlm_shards, so the event starts a
    run. Its validate refuses the event (made by the REST API, not by mlm_dataset_refresh), whatever it
    says: here it would lift the deployment's approval pin and point the corpus at /etc."""
    user = _as(airflow_stack, "user")
    assets = user.get("/assets", params={"name_pattern": "mlm_shards"}).json()["assets"]
    extra = {
        "fingerprint": "0123456789abcdef",
        "output_root": str(data_volume(airflow_stack) / "out-event"),
        "data_config": {
            "corpus": {"source": "local_files", "local_paths": ["/etc/*"]},
            "publish": {"require_approval": False},
        },
    }
    made = user.post("/assets/events", json={"asset_id": assets[0]["id"], "extra": extra})
    assert made.status_code == 200, made.text
    assert made.json()["extra"]["from_rest_api"] is True
    run_id = _wait_for_asset_run(airflow_api)
    done = airflow_api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
    assert done["state"] == "failed"
    log = airflow_api.log(DAG_ID, run_id, "validate", 1)
    assert "was made by the REST API, not by mlm_dataset_refresh" in log, log[-3000:]
    assert not (data_volume(airflow_stack) / "out-event").exists()


def _wait_for_asset_run(api, timeout: float = 180) -> str:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = api.get(f"/dags/{DAG_ID}/dagRuns", run_type="asset_triggered")["dag_runs"]
        found = [r for r in runs if r["run_type"] == "asset_triggered"]  # other tests' manual runs share the stack
        if found:
            return found[-1]["dag_run_id"]
        time.sleep(2)
    raise AssertionError(f"no asset-triggered run of {DAG_ID} within {timeout}s")


def test_user_cannot_edit_connections_op_can(airflow_stack):
    conn = {"connection_id": "mlm_role_check", "conn_type": "generic", "password": "not-a-real-secret"}
    for username in ("viewer", "user"):
        client = _as(airflow_stack, username)
        assert client.post("/connections", json=conn).status_code == 403, username
        assert client.get("/connections").status_code == 403, username  # not even the list
    op = _as(airflow_stack, "op")  # FAB's Op role manages connections, pools and variables
    made = op.post("/connections", json=conn)
    assert made.status_code == 201, made.text
    assert op.delete(f"/connections/{conn['connection_id']}").status_code == 204


def test_airflow_connects_to_postgresql_as_no_superuser(airflow_stack):
    """The metadata DB's role (every Airflow service and, under the LocalExecutor, every task can read its
    URL) owns its database and nothing more: no COPY ... TO PROGRAM, no other database, no new roles."""
    import psycopg2

    url = urlsplit(airflow_stack.spec.envs["airflow-scheduler"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    login = {"host": url.hostname, "port": url.port, "user": url.username, "password": url.password}
    with psycopg2.connect(dbname="airflow", **login) as conn, conn.cursor() as cur:
        cur.execute("SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user")
        assert cur.fetchone() == (False, False, False)
        cur.execute("SELECT count(*) FROM dag")  # it owns Airflow's tables
        assert cur.fetchone()[0] >= 1
        with pytest.raises(psycopg2.errors.InsufficientPrivilege, match="COPY to or from an external program"):
            cur.execute("COPY (SELECT 1) TO PROGRAM 'id'")
    with pytest.raises(psycopg2.OperationalError, match="permission denied for database"):
        psycopg2.connect(dbname="celery_results", **login)


def test_result_backend_role_reaches_only_its_own_database(airflow_stack):
    import psycopg2

    url = urlsplit(airflow_stack.spec.envs["airflow-scheduler"]["AIRFLOW__CELERY__RESULT_BACKEND"].removeprefix("db+"))
    login = {"host": url.hostname, "port": url.port, "user": url.username, "password": url.password}
    with psycopg2.connect(dbname=url.path.lstrip("/"), **login) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cur.fetchone() == ("celery_results", False)
    with pytest.raises(psycopg2.OperationalError, match="permission denied for database"):
        psycopg2.connect(dbname="airflow", **login)
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(dbname=url.path.lstrip("/"), **{**login, "password": "wrong"})
