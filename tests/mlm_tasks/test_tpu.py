"""mlm_tasks.tpu against the fake TPU v2 REST API, driven by the real google-cloud-tpu client."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound

from mlm_tasks import tpu
from mlm_tasks.config import TpuConfig

ZONE = "us-central2-b"


@pytest.fixture
def cfg(fake_tpu):
    return TpuConfig(project="proj", zone=ZONE, api_endpoint=fake_tpu.url, transport="rest")


def test_node_name_is_deterministic_and_valid():
    a = tpu.node_name("mlm_pretrain", "manual__2024-01-01T00:00:00+00:00")
    assert a == tpu.node_name("mlm_pretrain", "manual__2024-01-01T00:00:00+00:00")
    assert a != tpu.node_name("mlm_pretrain", "manual__2024-01-02T00:00:00+00:00")
    assert a.startswith("mlm-pretrain-")
    long = tpu.node_name("A_Very_Long_DAG_Name" * 10, "r")
    for name in (a, long, tpu.node_name("___", "r")):
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name), name


def test_labels_follow_gcp_rules():
    got = tpu.labels("manual__2024-01-01T00:00:00+00:00", ttl_hours=2, now=1000)
    assert got["created"] == "1000" and got["expires"] == str(1000 + 7200)
    for key, value in got.items():
        assert re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", key) and re.fullmatch(r"[-_a-z0-9]{0,63}", value)


def test_create_then_ready_is_reused(cfg, fake_tpu):
    name = tpu.node_name("mlm_pretrain", "run-1")
    first = tpu.ensure_node(cfg, name, tpu.labels("run-1", 1), {"ssh-keys": "u:k"})
    assert (first.action, first.state) == ("created", "CREATING") and first.operation
    node = fake_tpu.node("proj", ZONE, name)
    assert node["acceleratorType"] == "v4-8" and node["labels"]["run"] == "run-1"
    assert node["metadata"] == {"ssh-keys": "u:k"}
    assert node["networkConfig"]["enableExternalIps"] is True

    assert tpu.ensure_node(cfg, name, {}).action == "wait"  # 1st read: still CREATING
    second = tpu.ensure_node(cfg, name, {})  # 2nd read: READY in the fake
    assert (second.action, second.state) == ("ready", "READY")
    assert tpu.worker_endpoints(second) == ["127.0.0.1"]
    assert tpu.operation_error(cfg, first.operation) is None
    creates = [r for r in fake_tpu.requests if r[0] == "POST"]
    assert len(creates) == 1, "a READY node must be reused, not created again"


def test_creating_node_means_wait_and_conflict_is_a_wait(cfg, fake_tpu):
    fake_tpu.ready_after_gets = 100
    name = tpu.node_name("d", "r")
    assert tpu.ensure_node(cfg, name, {}).action == "created"
    assert tpu.ensure_node(cfg, name, {}).action == "wait"
    # A create racing another try's create: the API answers 409 and we wait for that node.
    api = tpu.client(cfg)

    def not_yet_visible(name):  # the other try's node is not visible to our get yet
        raise NotFound(name)

    api.get_node = not_yet_visible
    raced = tpu.ensure_node(cfg, name, {}, api=api)
    assert (raced.action, raced.state) == ("wait", "CREATING")


def test_preempted_node_is_deleted_then_recreated(cfg, fake_tpu):
    fake_tpu.delete_after_gets = 1
    name = tpu.node_name("d", "r")
    fake_tpu.add_node("proj", ZONE, name, state="READY")
    fake_tpu.preempt(name)
    assert tpu.get_state(cfg, name).state == "PREEMPTED"
    step = tpu.ensure_node(cfg, name, {"run": "r"})
    assert step.action == "recreating" and step.operation
    assert fake_tpu.node("proj", ZONE, name)["state"] == "DELETING"
    assert tpu.get_state(cfg, name).state == tpu.NOT_FOUND  # the fake finishes deleting
    again = tpu.ensure_node(cfg, name, {"run": "r"})
    assert again.action == "created"
    assert [tpu.ensure_node(cfg, name, {}).state for _ in range(2)] == ["CREATING", "READY"]


def test_failed_create_reports_operation_error(cfg, fake_tpu):
    fake_tpu.fail_next_create("There is no more capacity in the zone")
    name = tpu.node_name("d", "r")
    op = tpu.ensure_node(cfg, name, {}).operation
    assert tpu.operation_error(cfg, op) is None  # first read: still creating
    assert "no more capacity" in tpu.operation_error(cfg, op)
    assert tpu.get_state(cfg, name).state == "TERMINATED"


def test_delete_not_found_is_done(cfg, fake_tpu):
    name = tpu.node_name("d", "r")
    assert tpu.delete_node(cfg, name) is None
    fake_tpu.add_node("proj", ZONE, name)
    assert tpu.delete_node(cfg, name)
    assert tpu.get_state(cfg, name).state == tpu.NOT_FOUND


def test_list_expired_only_ours_and_past_ttl(cfg, fake_tpu):
    now = 1_000_000
    fake_tpu.add_node("proj", ZONE, "mlm-old", labels={"expires": str(now - 1)})
    fake_tpu.add_node("proj", ZONE, "mlm-fresh", labels={"expires": str(now + 3600)})
    fake_tpu.add_node("proj", ZONE, "mlm-unlabelled")
    fake_tpu.add_node("proj", ZONE, "other-old", labels={"expires": str(now - 1)})
    fake_tpu.add_node("proj", "europe-west4-a", "mlm-elsewhere", labels={"expires": "1"})
    assert [n.name for n in tpu.list_expired(cfg, now=now)] == ["mlm-old"]


def test_worker_endpoints_in_order_and_external(cfg, fake_tpu):
    fake_tpu.workers = 4
    fake_tpu.add_node("proj", ZONE, "mlm-pod")
    state = tpu.get_state(cfg, "mlm-pod")
    assert tpu.worker_endpoints(state) == ["127.0.0.1"] * 4
    assert tpu.worker_endpoints(state, external=True) == ["127.0.0.1"] * 4


def test_importing_mlm_tasks_tpu_does_not_import_airflow():
    code = "import mlm_tasks.tpu, sys; assert 'airflow' not in sys.modules, 'airflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).parents[2]))
