"""TPU VM operators against the fake TPU API: executed directly (deferral and trigger run by hand),
then in a real `airflow dags test` run with the SSH step on a real sshd and delete as teardown."""
import asyncio
import json
import textwrap
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from mlm_tasks import tpu
from peers.airflow_home import dags_test
from peers.sshd import airflow_conn_uri
from tpu_operators import TpuVmCreateOperator, TpuVmDeleteOperator, resolve_config

ZONE = "us-central2-b"
RUN = "manual__2024-01-01T00:00:00+00:00"
NAME = tpu.node_name("mlm_pretrain", RUN)


def _config(fake_tpu, **top):
    return {"compute": "tpu_vm", "output_root": "gs://bucket/p", **top,
            "tpu": {"project": "proj", "zone": ZONE, "api_endpoint": fake_tpu.url, "transport": "rest",
                    "poll_interval_s": 0.05, "bootstrap": False}}


def _context():
    return {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": RUN}


async def _first_event(trigger):
    async for event in trigger.run():
        return event.payload


def _run(op, tweak_trigger=None):
    """Execute like Airflow does: execute, and on each deferral run the trigger, then resume."""
    call, args = op.execute, (_context(),)
    while True:
        try:
            return call(*args)
        except TaskDeferred as deferred:
            if tweak_trigger:
                tweak_trigger(deferred.trigger)
            # What the triggerer stores and rebuilds: the trigger must survive serialization.
            classpath, kwargs = deferred.trigger.serialize()
            assert classpath == "tpu_trigger.TpuNodeTrigger"
            trigger = type(deferred.trigger)(**json.loads(json.dumps(kwargs)))
            event = asyncio.run(asyncio.wait_for(_first_event(trigger), 30))
            call, args = getattr(op, deferred.method_name), (_context(), event)


def test_create_defers_until_ready_then_retry_reuses(fake_tpu):
    fake_tpu.ready_after_gets = 3
    op = TpuVmCreateOperator(task_id="create_tpu_vm", config=_config(fake_tpu))
    with pytest.raises(TaskDeferred):
        op.execute(_context())  # CREATING: waits in the triggerer, not here
    fake_tpu.nodes.clear()
    result = _run(op)
    assert result == {"name": NAME, "state": "READY", "workers": [["127.0.0.1", "127.0.0.1"]]}
    node = fake_tpu.node("proj", ZONE, NAME)
    assert node["labels"]["run"].startswith("manual__2024-01-01t00-00-00")
    assert int(node["labels"]["expires"]) > time.time() + 11 * 3600
    # A retry finds the READY node and creates nothing.
    creates = sum(1 for r in fake_tpu.requests if r[0] == "POST")
    assert _run(op) == result
    assert sum(1 for r in fake_tpu.requests if r[0] == "POST") == creates


def test_create_replaces_a_preempted_node(fake_tpu):
    fake_tpu.delete_after_gets = 2
    fake_tpu.add_node("proj", ZONE, NAME, labels={"run": "x"})
    fake_tpu.preempt(NAME)
    result = _run(TpuVmCreateOperator(task_id="c", config=_config(fake_tpu)))
    assert result["state"] == "READY"
    methods = [m for m, _ in fake_tpu.requests]
    assert methods.count("DELETE") == 1 and methods.count("POST") == 1
    assert fake_tpu.node("proj", ZONE, NAME)["labels"]["run"] != "x"  # a fresh node


def test_failed_create_deletes_the_node_before_failing(fake_tpu):
    fake_tpu.fail_next_create("There is no more capacity in the zone")
    op = TpuVmCreateOperator(task_id="c", config=_config(fake_tpu))
    with pytest.raises(AirflowException, match="no more capacity.*deleted it"):
        _run(op)
    assert fake_tpu.node("proj", ZONE, NAME) is None


def test_create_timeout_deletes_the_node(fake_tpu):
    fake_tpu.ready_after_gets = 10**6

    def expire(trigger):
        trigger.deadline = time.time() - 1

    with pytest.raises(AirflowException, match="not READY within tpu.create_timeout_s=1800s.*deleted it"):
        _run(TpuVmCreateOperator(task_id="c", config=_config(fake_tpu)), tweak_trigger=expire)
    assert fake_tpu.node("proj", ZONE, NAME) is None


def test_create_puts_the_ssh_connection_key_in_metadata(fake_tpu, sshd, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))
    _run(TpuVmCreateOperator(task_id="c", config=_config(fake_tpu)))
    kind, key = open(sshd.key_path + ".pub").read().split()[:2]
    assert fake_tpu.node("proj", ZONE, NAME)["metadata"]["ssh-keys"] == f"{sshd.user}:{kind} {key} {sshd.user}"


def test_delete_is_idempotent(fake_tpu):
    fake_tpu.add_node("proj", ZONE, NAME)
    op = TpuVmDeleteOperator(task_id="d", config=json.dumps(_config(fake_tpu)))
    assert op.execute(_context())
    assert fake_tpu.node("proj", ZONE, NAME) is None
    assert op.execute(_context()) is None  # NotFound is success


def test_operators_do_nothing_for_local_compute(fake_tpu):
    # No-ops that succeed (not skips): train follows create_tpu_vm with all_success.
    local = {"compute": "local", "output_root": "/tmp/x"}
    for op in (TpuVmCreateOperator(task_id="c", config=local), TpuVmDeleteOperator(task_id="d", config=local)):
        assert op.execute(_context()) is None
    assert fake_tpu.requests == []


def test_resolve_config_accepts_rendered_forms(fake_tpu):
    raw = _config(fake_tpu, publish={"enabled": False, "repo_id": None})
    for form in (raw, json.dumps(raw), repr(raw), lambda: raw):
        assert resolve_config(form).tpu.api_endpoint == fake_tpu.url


DAG_FILE = '''
"""Test DAG: config -> create TPU VM -> remote step (worker 0) -> delete (teardown)."""
import pendulum
from airflow.sdk import dag, task

from remote_step import TpuSSHStepOperator
from tpu_operators import TpuVmCreateOperator, TpuVmDeleteOperator


@dag(dag_id="tpu_ops_test", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
def tpu_ops_test():
    @task
    def validate_config(**context):
        from mlm_tasks.config import build_config
        return build_config(context["dag_run"].conf["config"]).model_dump(mode="json")

    cfg = "{{ ti.xcom_pull(task_ids='validate_config') }}"
    create = TpuVmCreateOperator(task_id="create_tpu_vm", config=cfg)
    step = TpuSSHStepOperator(task_id="train", config=cfg, command="{{ dag_run.conf['command'] }}")
    delete = TpuVmDeleteOperator(task_id="delete_tpu_vm", config=cfg)
    validate_config() >> create >> step >> delete.as_teardown(setups=create)


tpu_ops_test()
'''


@pytest.mark.parametrize("command, ok", [("echo remote-says-hi $((6*7))", True), ("echo about-to-fail; exit 5", False)])
def test_dag_run_creates_runs_and_tears_down(airflow_env, fake_tpu, sshd, tmp_path, command, ok):
    fake_tpu.workers = 2
    dag_file = tmp_path / "tpu_ops_test.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE))
    config = _config(fake_tpu)
    # Two hosts: a pod slice, so a -pod runtime, and the step runs on worker 0 only (single-client TF).
    config["tpu"].update(ssh_port=sshd.port, poll_interval_s=0.2, accelerator_type="v4-32",
                         runtime_version="tpu-vm-tf-2.16.1-pod-pjrt")
    result = dags_test(airflow_env, "tpu_ops_test", dagfile=dag_file, conf={"config": config, "command": command},
                       extra_env={"AIRFLOW_CONN_TPU_SSH": airflow_conn_uri(sshd)})
    logs = result.stdout + result.stderr
    assert (result.returncode == 0) == ok, logs[-6000:]
    created = [p for m, p in fake_tpu.requests if m == "POST"]
    assert len(created) == 1 and "/nodes" in created[0]
    assert [m for m, _ in fake_tpu.requests].count("DELETE") == 1, "teardown must delete the VM"
    assert fake_tpu.nodes == {}
    if ok:
        assert "[worker 0] remote-says-hi 42" in logs
    else:
        assert "worker 0 (127.0.0.1): exit code 5" in logs and "worker 1 (127.0.0.1)" not in logs
