"""TPU VM operators against the fake TPU API: executed directly (deferral and trigger run by hand),
then in a real `airflow dags test` run with the SSH step on a real sshd and delete as teardown."""

import json
import logging
import os
import textwrap
import time
from types import SimpleNamespace

import pytest
from airflow._shared.module_loading import import_string  # what the triggerer imports a classpath with
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException, TaskDeferred

from mlm_airflow.operators.tpu_vm import TpuVmCreateOperator, TpuVmDeleteOperator
from mlm_airflow.tasks.step_context import config_from_xcom
from mlm_tasks.errors import ConfigError
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import registry as tpu_registry
from peers.airflow_home import ROOT, dags_test
from peers.deferral import run_deferrable
from peers.sshd import airflow_conn_uri

ZONE = "us-central2-b"
RUN = "manual__2024-01-01T00:00:00+00:00"
NAME = tpu.node_name("mlm_pretrain", RUN)


def _config(fake_tpu, tpu_settings=None, **top):
    return {
        "compute": "tpu_vm",
        "output_root": "gs://bucket/p",
        **top,
        "tpu": {
            "project": "proj",
            "zone": ZONE,
            "api_endpoint": fake_tpu.url,
            "transport": "rest",
            "poll_interval_s": 0.05,
            "bootstrap": False,
            **(tpu_settings or {}),
        },
    }


def _context():
    return {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": RUN}


def _run(op, tweak_trigger=None):
    """Execute like Airflow does: execute, and on each deferral run the trigger, then resume."""

    def tweak(trigger):
        # The triggerer imports the trigger by this path (plugins/ is on its sys.path).
        assert trigger.serialize()[0] == "mlm_airflow.triggers.tpu_vm.TpuNodeTrigger"
        assert import_string(trigger.serialize()[0]) is type(trigger)
        if tweak_trigger:
            tweak_trigger(trigger)

    return run_deferrable(op, _context, tweak=tweak, timeout=30)


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


def test_create_replaces_a_preempted_node(fake_tpu, gcs_root):
    fake_tpu.delete_after_gets = 2
    fake_tpu.add_node("proj", ZONE, NAME, labels={"run": "x"})
    fake_tpu.preempt(NAME)
    result = _run(TpuVmCreateOperator(task_id="c", config=_config(fake_tpu, output_root=gcs_root)))
    assert result["state"] == "READY"
    methods = [m for m, _ in fake_tpu.requests]
    assert methods.count("DELETE") == 1 and methods.count("POST") == 1
    assert fake_tpu.node("proj", ZONE, NAME)["labels"]["run"] != "x"  # a fresh node


def test_failed_create_deletes_the_node_before_failing(fake_tpu, gcs_root):
    fake_tpu.fail_next_create("Internal error: the node's boot disk could not be attached")  # no stockout
    op = TpuVmCreateOperator(task_id="c", config=_config(fake_tpu, output_root=gcs_root))
    with pytest.raises(AirflowException, match="boot disk could not be attached.*deleted it. Retry"):
        _run(op)
    assert fake_tpu.node("proj", ZONE, NAME) is None
    assert [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")] == ["POST", "DELETE"]  # no second create


def test_a_stockout_is_waited_out_inside_the_try(fake_tpu, gcs_root, caplog):
    """Issue 31: the zone has no capacity for two creates; the task deletes what each left, waits
    tpu.stockout_retry_s (20 node polls; deferred: no worker slot) and creates again, in one try, until a
    node is READY."""
    fake_tpu.fail_next_create("There is no more capacity in the zone", times=2)
    config = _config(fake_tpu, {"poll_interval_s": 0.06}, output_root=gcs_root)
    op = _logging_to_caplog(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))
    deferrals = []
    with caplog.at_level("INFO"):
        node = _run(op, tweak_trigger=deferrals.append)
    assert node["state"] == "READY" and fake_tpu.node("proj", ZONE, NAME)["state"] == "READY"
    assert [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")] == ["POST", "DELETE"] * 2 + ["POST"]
    waits = [t for t in deferrals if t.not_before is not None]  # the pauses between creates, one per stockout
    assert len(waits) == 2 and all(t.until_gone for t in waits)
    assert len({t.stockout_until for t in waits}) == 1  # one budget from the first stockout, not one per create
    assert waits[0].stockout_until == pytest.approx(time.time() + 4 * 3600, abs=60)  # tpu.stockout_wait_hours: 4
    assert caplog.text.count(f"No capacity for v4-8 in {ZONE}") == 2 and "in this try" in caplog.text


def test_a_spot_node_preempted_before_ready_is_replaced_and_no_reserved_capacity_waits(fake_tpu, gcs_root):
    """Issue 48: a Spot node taken back while CREATING (the create operation's code 3, the node PREEMPTED) is
    deleted and made again; a reservation without room (code 9) is waited out like a stockout; both in one try."""
    fake_tpu.fail_next_create(
        "Cloud TPU received a bad request. update is not supported while in state PREEMPTED", "PREEMPTED", code=3
    )
    config = _config(fake_tpu, output_root=gcs_root)
    assert _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))["state"] == "READY"
    assert [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")] == ["POST", "DELETE", "POST"]

    fake_tpu.nodes.clear()
    fake_tpu.requests.clear()
    fake_tpu.fail_next_create("Insufficient reserved capacity. Contact customer support.", code=9)
    deferrals = []
    assert _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config), deferrals.append)["state"] == "READY"
    assert [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")] == ["POST", "DELETE", "POST"]
    assert [t.stockout_until is not None for t in deferrals if t.not_before is not None] == [True]


def test_a_quota_refusal_fails_at_once_without_retry_naming_the_quota_and_region(fake_tpu, gcs_root):
    """Issue 48: a 429 naming a quota is the answer, not a busy API: no 5-minute retry, no Airflow retry."""
    fake_tpu.refuse_next_create(
        "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 32 in zone us-central2-b."
    )
    config = _config(fake_tpu, output_root=gcs_root)
    with pytest.raises(AirflowFailException, match=r"quota TPUV4sPodPerProjectPerZoneForTPUAPI in region us-central2"):
        _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))
    assert [m for m, _ in fake_tpu.requests if m in ("POST", "DELETE")] == []  # refused: nothing made, none to delete
    assert [(m, code) for m, path, code in fake_tpu.answers if m == "POST"] == [("POST", 429)]  # asked once


def test_a_stockout_past_its_wait_fails_the_try_naming_the_setting(fake_tpu, gcs_root):
    fake_tpu.fail_next_create("There is no more capacity in the zone", times=100)
    config = _config(fake_tpu, {"poll_interval_s": 0.01, "stockout_wait_hours": 0.0003}, output_root=gcs_root)
    with pytest.raises(AirflowException, match=r"no capacity for tpu.stockout_wait_hours=0.0003: raise it"):
        _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))  # ~1 s of creates, then the end
    assert fake_tpu.nodes == {}
    creates = [m for m, _ in fake_tpu.requests if m == "POST"]
    assert 2 <= len(creates) <= 6, creates
    off = _config(fake_tpu, {"stockout_wait_hours": 0}, output_root=gcs_root)  # 0: a stockout fails at once
    fake_tpu.requests.clear()
    with pytest.raises(AirflowException, match="no more capacity.*deleted it"):
        _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=off))
    assert [m for m, _ in fake_tpu.requests if m == "POST"] == ["POST"]


def test_a_queued_request_waits_deferred_gives_the_node_and_goes_with_the_teardown(fake_tpu, gcs_root, capfd):
    """tpu.provisioning=queued: create_tpu_vm queues a request and waits in the triggerer (no worker slot)
    while Google's queue has no capacity, until its node is READY; the teardown deletes the request with its
    node; a preempted one is queued anew inside the try."""
    fake_tpu.queue_gets = 4
    config = _config(fake_tpu, {"provisioning": "queued", "queued_valid_hours": 2}, output_root=gcs_root)
    deferrals = []
    node = _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config), tweak_trigger=deferrals.append)
    assert node["state"] == "READY" and fake_tpu.queued_resource("proj", ZONE, NAME)["state"]["state"] == "ACTIVE"
    assert "is QUEUED (WAITING_FOR_RESOURCES); checking again" in capfd.readouterr().out  # the trigger's log
    assert deferrals[0].deadline == pytest.approx(time.time() + 2 * 3600 + 1800, abs=60)  # the queue's validity too

    fake_tpu.preempt(NAME)  # Spot capacity taken back: the node PREEMPTED, its request SUSPENDED
    assert _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))["state"] == "READY"
    queued_posts = [path for m, path in fake_tpu.requests if m == "POST" and path.endswith("/queuedResources")]
    assert len(queued_posts) == 2 and not any(path.endswith("/nodes") for m, path in fake_tpu.requests if m == "POST")

    assert _run(TpuVmDeleteOperator(task_id="delete_tpu_vm", config=config)) == NAME
    assert fake_tpu.nodes == {} and fake_tpu.queued == {}


def test_a_failed_queued_request_fails_the_try_naming_its_validity(fake_tpu, gcs_root):
    fake_tpu.fail_next_queued("The queued resource request expired before capacity was found.")
    config = _config(fake_tpu, {"provisioning": "queued", "queued_valid_hours": 1}, output_root=gcs_root)
    with pytest.raises(
        AirflowException, match=r"queued resource is FAILED: The queued resource request expired .*queued_valid_hours=1"
    ):
        _run(TpuVmCreateOperator(task_id="create_tpu_vm", config=config))
    assert fake_tpu.queued == {} and fake_tpu.nodes == {}  # deleted: a retry queues anew under the same name


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
    with open(sshd.key_path + ".pub") as f:
        kind, key = f.read().split()[:2]
    assert fake_tpu.node("proj", ZONE, NAME)["metadata"]["ssh-keys"] == f"{sshd.user}:{kind} {key} {sshd.user}"


def _connection(key: dict) -> str:
    return json.dumps({"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(key)}})


def test_every_tpu_call_uses_the_connections_credentials(fake_tpu, oauth_server, monkeypatch, caplog):
    # The connection holds another key than the one this test process was handed: every call the
    # operators and the trigger make must be signed by the connection's key.
    key = oauth_server.new_service_account("from-connection@mlm-test-project.iam.gserviceaccount.com")
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", _connection(key))
    with caplog.at_level("INFO"):
        _run(TpuVmCreateOperator(task_id="c", config=_config(fake_tpu)))
        _run(TpuVmDeleteOperator(task_id="d", config=_config(fake_tpu)))  # the wait for "gone" too
    assert fake_tpu.principals == {key["client_email"]}
    assert fake_tpu.writes() == ["POST", "DELETE"]
    assert "credentials of Airflow connection 'google_cloud_default'" in caplog.text


def test_connection_without_credentials_falls_back_to_adc_and_says_so(
    fake_tpu, oauth_server, sa_key, monkeypatch, tmp_path, caplog
):
    from mlm_tasks import credentials

    # ADC: a key file named by GOOGLE_APPLICATION_CREDENTIALS (on GCP: the machine's service account).
    adc = oauth_server.new_service_account("adc@mlm-test-project.iam.gserviceaccount.com")
    (tmp_path / "adc.json").write_text(json.dumps(adc))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}),
    )
    with credentials.use(None), caplog.at_level("INFO"):
        TpuVmDeleteOperator(task_id="d", config=_config(fake_tpu)).execute(_context())
    assert (
        "connection 'google_cloud_default' holds no key or other credentials: Google clients use "
        "Application Default Credentials" in caplog.text
    )
    assert fake_tpu.principals == {adc["client_email"]}
    # No connection at all: the same fallback, logged as such.
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")
    caplog.clear()
    with credentials.use(None), caplog.at_level("INFO"):
        TpuVmDeleteOperator(task_id="d", config=_config(fake_tpu)).execute(_context())
    assert "No Airflow connection 'google_cloud_default'" in caplog.text


def test_delete_is_idempotent(fake_tpu, gcs_root):
    fake_tpu.add_node("proj", ZONE, NAME)
    op = TpuVmDeleteOperator(task_id="d", config=json.dumps(_config(fake_tpu, output_root=gcs_root)))
    assert _run(op) == NAME
    assert fake_tpu.node("proj", ZONE, NAME) is None
    assert op.execute(_context()) is None  # NotFound is success


def _logging_to_caplog(op):
    op._cached_logger = logging.getLogger("test.tpu_operators")  # the task logger (structlog) bypasses caplog
    return op


def _with_tpu(config, **tpu_settings):
    return {**config, "tpu": {**config["tpu"], **tpu_settings}}


def test_delete_waits_until_the_node_is_gone_and_forgets_it(fake_tpu, gcs_root, caplog):
    fake_tpu.delete_after_gets = 3  # DELETING for three reads, as the real API lingers
    fake_tpu.add_node("proj", ZONE, NAME)
    tpu_registry.record(fake_tpu.registry, "proj", ZONE, NAME, expires=1)
    op = _logging_to_caplog(TpuVmDeleteOperator(task_id="d", config=_config(fake_tpu, output_root=gcs_root)))
    with pytest.raises(TaskDeferred):
        op.execute(_context())  # the delete was accepted, the node is still DELETING: wait, not done
    fake_tpu.delete_after_gets, fake_tpu._transient = 3, {}
    fake_tpu.add_node("proj", ZONE, NAME)
    with caplog.at_level("INFO"):
        assert _run(op) == NAME
    assert fake_tpu.node("proj", ZONE, NAME) is None
    assert "deleted (confirmed: the API no longer knows it)" in caplog.text
    assert tpu_registry.entries(fake_tpu.registry) == []


def test_delete_not_gone_within_the_bound_is_left_to_the_janitor(fake_tpu, caplog):
    fake_tpu.delete_after_gets = 10**6  # stuck in DELETING
    fake_tpu.add_node("proj", ZONE, NAME)
    tpu_registry.record(fake_tpu.registry, "proj", ZONE, NAME, expires=1)
    op = _logging_to_caplog(TpuVmDeleteOperator(task_id="d", config=_with_tpu(_config(fake_tpu), delete_timeout_s=1)))
    started = time.monotonic()
    with caplog.at_level("INFO"):
        assert _run(op) == NAME
    assert time.monotonic() - started < 10
    assert "still DELETING after tpu.delete_timeout_s=1s: left to mlm_tpu_janitor" in caplog.text
    assert [e.name for e in tpu_registry.entries(fake_tpu.registry)] == [NAME]  # the janitor will look


def test_a_delete_the_api_refuses_fails_loudly(fake_tpu):
    fake_tpu.add_node("proj", ZONE, NAME)
    fake_tpu.refuse_deletes(403, "PERMISSION_DENIED", "Permission 'tpu.nodes.delete' denied.")
    op = TpuVmDeleteOperator(task_id="d", config=_config(fake_tpu))
    with pytest.raises(
        AirflowFailException,
        match=r"refused to delete TPU VM .*403 .*Permission 'tpu.nodes.delete'"
        r".*gcloud compute tpus tpu-vm delete " + NAME,
    ):
        op.execute(_context())
    assert fake_tpu.node("proj", ZONE, NAME) is not None


def test_create_records_the_node_for_the_janitor_and_needs_the_registry(fake_tpu, monkeypatch):
    op = TpuVmCreateOperator(task_id="create_tpu_vm", config=_config(fake_tpu))
    _run(op)
    (entry,) = tpu_registry.entries(fake_tpu.registry)
    node = fake_tpu.node("proj", ZONE, NAME)
    assert (entry.project, entry.zone, entry.name) == ("proj", ZONE, NAME)
    assert str(entry.expires) == node["labels"]["expires"]
    monkeypatch.delenv("MLM_TPU_REGISTRY")
    fake_tpu.nodes.clear()
    with pytest.raises(ConfigError, match="MLM_TPU_REGISTRY is not set: set it .* gs://YOUR-BUCKET"):
        op.execute(_context())
    assert fake_tpu.nodes == {}, "nothing is made that the janitor would not find"


def test_operators_skip_for_local_compute_saying_why(fake_tpu):
    # Skipped, not succeeded: the grid must not read as if a VM had been made (train follows with none_failed).
    local = {"compute": "local", "output_root": "/tmp/x"}
    with pytest.raises(AirflowSkipException, match="compute is 'local': this run needs no TPU VM, none is made"):
        TpuVmCreateOperator(task_id="c", config=local).execute(_context())
    with pytest.raises(AirflowSkipException, match="compute is 'local': this run made no TPU VM, none to delete"):
        TpuVmDeleteOperator(task_id="d", config=local).execute(_context())
    # The teardown runs after a failed validate too: no config, no VM, nothing asked of the TPU API.
    with pytest.raises(AirflowSkipException, match="validate did not succeed"):
        TpuVmDeleteOperator(task_id="d", config=None).execute(_context())
    assert fake_tpu.requests == []


def test_config_from_xcom_takes_the_forms_an_xcom_renders_to(fake_tpu):
    raw = _config(fake_tpu, publish={"enabled": False, "repo_id": None})
    for form in (raw, json.dumps(raw)):  # an XComArg or a template rendered with native types; one rendered as text
        assert config_from_xcom(form).tpu.api_endpoint == fake_tpu.url
    for wrong, why in ((repr(raw), "text that is not JSON"), (None, "got NoneType"), ([raw], "got list")):
        with pytest.raises(AirflowFailException, match=why):
            config_from_xcom(wrong)


DAG_FILE = '''
"""Test DAG: config -> create TPU VM -> remote step (worker 0) -> delete (teardown)."""
import pendulum
from airflow.sdk import dag, task

from mlm_airflow.operators.tpu_vm import TpuVmCreateOperator, TpuVmDeleteOperator
from peers.tpu_step_operator import TpuSSHStepOperator


@dag(dag_id="tpu_ops_test", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
def tpu_ops_test():
    @task
    def validate(**context):
        from mlm_tasks.config import build_config
        return build_config(context["dag_run"].conf["config"]).model_dump(mode="json")

    cfg = validate()  # an XComArg, as mlm_pretrain hands the validated config on
    create = TpuVmCreateOperator(task_id="create_tpu_vm", config=cfg)
    step = TpuSSHStepOperator(task_id="train", config=cfg, command="{{ dag_run.conf['command'] }}")
    delete = TpuVmDeleteOperator(task_id="delete_tpu_vm", config=cfg)
    cfg >> create >> step >> delete.as_teardown(setups=create)


tpu_ops_test()
'''


@pytest.mark.parametrize(
    "command, ok, provisioning",
    [
        ("echo remote-says-hi $((6*7))", True, "on_demand"),
        ("echo about-to-fail; exit 5", False, "on_demand"),
        ("echo remote-says-hi $((6*7))", True, "queued"),  # a queued resource, through the real trigger
    ],
)
def test_dag_run_creates_runs_and_tears_down(
    airflow_env, fake_tpu, sshd, gcs_root, tmp_path, command, ok, provisioning
):
    dag_file = tmp_path / "tpu_ops_test.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE))
    config = _config(fake_tpu, output_root=gcs_root)
    # Two hosts: a pod slice, so a -pod runtime, and the step runs on worker 0 only (single-client TF).
    config["tpu"].update(
        ssh_port=sshd.port,
        poll_interval_s=0.2,
        accelerator_type="v4-32",
        runtime_version="tpu-vm-tf-2.16.1-pod-pjrt",
        provisioning=provisioning,
    )
    # tests/ on the path too: the test DAG's step operator is a peer (peers/tpu_step_operator.py).
    pythonpath = os.pathsep.join([airflow_env["PYTHONPATH"], str(ROOT / "tests")])
    result = dags_test(
        airflow_env,
        "tpu_ops_test",
        dagfile=dag_file,
        conf={"config": config, "command": command},
        extra_env={"AIRFLOW_CONN_TPU_SSH": airflow_conn_uri(sshd), "PYTHONPATH": pythonpath},
    )
    logs = result.stdout + result.stderr
    assert (result.returncode == 0) == ok, logs[-6000:]
    created = [p for m, p in fake_tpu.requests if m == "POST" and not p.endswith(":getGuestAttributes")]
    assert len(created) == 1 and created[0].endswith("/queuedResources" if provisioning == "queued" else "/nodes")
    assert [m for m, _ in fake_tpu.requests].count("DELETE") == 1, "teardown must delete the VM"
    assert fake_tpu.nodes == {} and fake_tpu.queued == {}
    if ok:
        assert "[worker 0] remote-says-hi 42" in logs
    else:
        assert "worker 0 (127.0.0.1): exit code 5" in logs and "worker 1 (127.0.0.1)" not in logs


def test_unreachable_worker_fails_the_step_at_once_with_the_fix(fake_tpu, sshd, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from peers.tpu_step_operator import TpuSSHStepOperator

    monkeypatch.setenv("AIRFLOW_CONN_TPU_SSH", airflow_conn_uri(sshd))
    # ssh_via=external: the workers' external IP is one where nothing listens (sshd is on 127.0.0.1).
    fake_tpu.external_ip = "127.0.0.2"
    config = _config(fake_tpu)
    config["tpu"].update(ssh_port=sshd.port, ssh_via="external")
    _run(TpuVmCreateOperator(task_id="c", config=config))
    step = TpuSSHStepOperator(task_id="train", config=config, command="echo never-runs")
    started = time.monotonic()
    with pytest.raises(AirflowFailException) as err:
        step.execute(_context())
    assert time.monotonic() - started < 15, "the probe must not wait out the SSH patience"
    message = str(err.value)
    assert f"worker 0 127.0.0.2:{sshd.port}" in message and "via its external IPs" in message
    assert "allow tcp:" in message and "firewall-rules create" in message and "enable-oslogin" in message
    # The same node dialled on its internal IPs reaches the sshd.
    config["tpu"]["ssh_via"] = "internal"
    assert TpuSSHStepOperator(task_id="train", config=config, command="true").execute(_context())["workers"] == 1


def test_train_execution_timeout_comes_from_the_config_and_never_outlives_the_ttl(fake_tpu, monkeypatch):
    from datetime import timedelta

    from mlm_airflow.operators.train import TrainOperator
    from mlm_tasks import credentials
    from mlm_tasks.config import build_config
    from mlm_tasks.errors import ConfigError

    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "restored-after-the-test")  # pre_execute sets it
    try:
        op = TrainOperator(
            task_id="train", data={"fingerprint": "fp"}, config=_config(fake_tpu, train={"timeout_hours": 6})
        )
        op.pre_execute(_context())
        assert op.execution_timeout == timedelta(hours=6)
        # The default on a TPU VM: the TTL (12 h).
        op = TrainOperator(task_id="train", data={"fingerprint": "fp"}, config=_config(fake_tpu))
        op.pre_execute(_context())
        assert op.execution_timeout == timedelta(hours=12)
        # pre_execute also handed the task's clients the connection's key (process-wide, as in a task).
        assert credentials.current().service_account_email == fake_tpu.credentials.service_account_email
    finally:
        credentials.install(None)
        credentials.stop_sharing_with_tensorflow()
    with pytest.raises(ConfigError, match="longer than tpu.ttl_hours"):
        build_config({**_config(fake_tpu), "train": {"timeout_hours": 13}})
