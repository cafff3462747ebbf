"""The janitor's sweep (mlm_tasks/tpu/registry.py) against the fake TPU API, with no Airflow: expired
`mlm-*` nodes go in the janitor's zones and wherever the registry recorded one; a refused delete spares
none of the others and is named; entries of nodes that are gone are forgotten. The DAG around it, under
`airflow dags test`: tests/dags/test_janitor.py."""

import time

import pytest

from mlm_tasks.config import TpuConfig
from mlm_tasks.config.deployment import Deployment, janitor_api
from mlm_tasks.errors import ConfigError
from mlm_tasks.tpu import registry

ZONE, OTHER = "us-central2-b", "europe-west4-a"


@pytest.fixture
def api(fake_tpu):
    return TpuConfig(project="proj", api_endpoint=fake_tpu.url, transport="rest")


def test_the_sweep_deletes_expired_nodes_everywhere_recorded_and_names_what_it_could_not(api, fake_tpu):
    now = int(time.time())
    fake_tpu.add_node("proj", ZONE, "mlm-a-refused", labels={"expires": str(now - 60)})
    fake_tpu.add_node("proj", ZONE, "mlm-b-expired", labels={"expires": str(now - 60), "run": "old"})
    fake_tpu.add_node("proj", ZONE, "mlm-fresh", labels={"expires": str(now + 3600)})
    fake_tpu.add_node("other-proj", OTHER, "mlm-far", labels={"expires": str(now - 60)})
    registry.record(fake_tpu.registry, "other-proj", OTHER, "mlm-far", now - 60)
    registry.record(fake_tpu.registry, "proj", "us-east5-a", "mlm-long-gone", now - 60)
    fake_tpu.refuse_delete("proj", ZONE, "mlm-a-refused", code=403)

    sweep = registry.delete_expired(api, [ZONE], fake_tpu.registry)

    assert sweep.deleted == [f"{ZONE}/mlm-b-expired", f"{OTHER}/mlm-far"]
    assert sweep.undeleted == [f"{ZONE}/mlm-a-refused"] and sweep.unlisted == []
    problems = sweep.problems("google_cloud_default")
    assert problems and f"Could not delete TPU VM(s) ['{ZONE}/mlm-a-refused']" in problems
    assert fake_tpu.node("proj", ZONE, "mlm-fresh") is not None
    assert registry.Sweep(deleted=["z/n"]).problems("c") is None

    assert registry.forget_gone(api, fake_tpu.registry) == [
        "other-proj/europe-west4-a/mlm-far",
        "proj/us-east5-a/mlm-long-gone",
    ]
    assert registry.entries(fake_tpu.registry) == []


def test_the_sweep_deletes_expired_queued_resources_with_their_nodes(api, fake_tpu):
    """tpu.provisioning=queued: the janitor's own config is not queued, yet a request whose node's `expires`
    label is past goes, with its node (a FAILED one, which has none, too); a fresh one stays."""
    from mlm_tasks.tpu import api as tpu
    from mlm_tasks.tpu import queued

    now = time.time()
    run = TpuConfig(project="proj", zone=ZONE, api_endpoint=fake_tpu.url, transport="rest", provisioning="queued")
    for name, expires in (("mlm-q-expired", now - 60), ("mlm-q-failed", now - 60), ("mlm-q-fresh", now + 3600)):
        if name == "mlm-q-failed":
            fake_tpu.fail_next_queued()
        tpu.ensure_node(run, name, {"expires": str(int(expires))})
        for _ in range(6):  # reads move the fake along: queued, provisioned, READY (or FAILED)
            queued.get_state(run, name), tpu.get_state(run, name)
    assert fake_tpu.queued_resource("proj", ZONE, "mlm-q-failed")["state"]["state"] == "FAILED"
    assert fake_tpu.node("proj", ZONE, "mlm-q-expired")["state"] == "READY"

    sweep = registry.delete_expired(api, [ZONE], fake_tpu.registry)

    assert sweep.deleted == [f"{ZONE}/mlm-q-expired", f"{ZONE}/mlm-q-failed"] and sweep.undeleted == []
    assert [n.rsplit("/", 1)[-1] for n in fake_tpu.queued] == ["mlm-q-fresh"]
    assert [n.rsplit("/", 1)[-1] for n in fake_tpu.nodes] == ["mlm-q-fresh"]
    assert queued.get_state(run, "mlm-q-fresh").state == "ACTIVE"


def test_a_zone_from_a_trigger_is_validated_before_it_reaches_a_resource_path(api, fake_tpu):
    with pytest.raises(ValueError, match="zone"):
        registry.delete_expired(api, ["../../projects/x"], fake_tpu.registry)
    assert fake_tpu.requests == []


def test_the_janitors_project_and_api_are_the_deployments(monkeypatch, tmp_path):
    for name in ("MLM_TPU_PROJECT", "MLM_GCP_CONN_ID", "MLM_TPU_API_ENDPOINT", "MLM_TPU_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="The janitor has no project to check: set MLM_TPU_PROJECT"):
        janitor_api(Deployment.builtin())
    monkeypatch.setenv("MLM_TPU_PROJECT", "env-proj")
    api, conn_id = janitor_api(Deployment.builtin())
    assert (api.project, api.transport, api.api_endpoint, conn_id) == ("env-proj", "grpc", None, "google_cloud_default")
    dep = tmp_path / "deployment.yaml"
    dep.write_text("settings: {gcp_conn_id: gcp_ops, tpu: {project: file-proj, transport: rest}}\n")
    api, conn_id = janitor_api(Deployment.load(str(dep)))
    assert (api.project, api.transport, conn_id) == ("file-proj", "rest", "gcp_ops")
