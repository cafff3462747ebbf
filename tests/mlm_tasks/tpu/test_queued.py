"""tpu.provisioning (mlm_tasks/tpu/api.py, mlm_tasks/tpu/queued.py) against the fake TPU v2 REST API with the
real google-cloud-tpu client: on-demand and Spot nodes, and queued resources through their states."""

import pytest
from google.api_core.exceptions import BadRequest

from mlm_tasks.config import TpuConfig
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import queued

ZONE = "us-central2-b"
NAME = tpu.node_name("mlm_pretrain", "run-q")


def _cfg(fake_tpu, **settings):
    return TpuConfig(project="proj", zone=ZONE, api_endpoint=fake_tpu.url, transport="rest", **settings)


@pytest.mark.parametrize(("provisioning", "scheduling"), [("on_demand", {}), ("spot", {"spot": True})])
def test_on_demand_and_spot_create_the_node(fake_tpu, provisioning, scheduling):
    cfg = _cfg(fake_tpu, provisioning=provisioning)
    assert tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1)).action == "created"
    assert fake_tpu.node("proj", ZONE, NAME).get("schedulingConfig") == scheduling
    assert fake_tpu.queued == {}
    assert cfg.spot is (provisioning == "spot")


def test_a_queued_request_waits_through_its_states_then_gives_the_node(fake_tpu):
    cfg = _cfg(fake_tpu, provisioning="queued", queued_valid_hours=6)
    first = tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1), {"ssh-keys": "mlm:ssh-ed25519 AAAA mlm"})
    assert (first.action, first.state) == ("created", "QUEUED") and first.operation
    assert tpu.operation_error(cfg, first.operation) is None  # accepted
    request = fake_tpu.queued_resource("proj", ZONE, NAME)
    assert request["spot"] == {} and "guaranteed" not in request  # the Spot tier, on the request
    assert request["queueingPolicy"] == {"validUntilDuration": "21600s"}
    (spec,) = request["tpu"]["nodeSpec"]
    assert (spec["parent"], spec["nodeId"]) == (tpu.parent(cfg), NAME)
    assert spec["node"]["acceleratorType"] == "v4-8" and spec["node"]["labels"]["run"] == "run-q"
    assert not (spec["node"].get("schedulingConfig") or {}).get("spot")  # the API refuses Spot on the node

    seen = []
    for _ in range(12):
        state = tpu.ensure_node(cfg, NAME, {})
        seen.append(state.state)
        if state.ready:
            break
        assert state.action == "wait", state
    # The request waits for capacity (no node yet), then its node is made (CREATING) and READY.
    assert seen[0] == "QUEUED (WAITING_FOR_RESOURCES)" and seen[-2:] == ["CREATING", "READY"], seen
    assert queued.get_state(cfg, NAME).state == "ACTIVE"
    assert fake_tpu.node("proj", ZONE, NAME)["queuedResource"] == queued.full_name(cfg, NAME)
    assert len([m for m, path in fake_tpu.requests if m == "POST" and path.endswith("/queuedResources")]) == 1


def test_a_failed_or_suspended_request_is_deleted_and_queued_anew(fake_tpu):
    cfg = _cfg(fake_tpu, provisioning="queued")
    fake_tpu.fail_next_queued("No capacity was found within validUntilDuration.")
    tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1))
    for _ in range(4):
        failed = queued.get_state(cfg, NAME)
    assert (failed.state, failed.error) == ("FAILED", "No capacity was found within validUntilDuration.")
    again = tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1))
    assert (again.action, again.replaced) == ("recreating", "FAILED")
    assert queued.get_state(cfg, NAME).state == tpu.NOT_FOUND
    assert tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1)).action == "created"  # queued anew

    while not tpu.ensure_node(cfg, NAME, {}).ready:
        pass
    fake_tpu.preempt(NAME)  # a Spot node preempted: the node PREEMPTED, its request SUSPENDED
    assert queued.get_state(cfg, NAME).state == "SUSPENDED"
    replaced = tpu.ensure_node(cfg, NAME, {})
    assert (replaced.action, replaced.replaced) == ("recreating", "PREEMPTED")
    assert fake_tpu.node("proj", ZONE, NAME) is None  # the request's delete took its node (force)
    assert queued.get_state(cfg, NAME).state == tpu.NOT_FOUND


def test_delete_node_deletes_the_request_with_its_node(fake_tpu):
    cfg = _cfg(fake_tpu, provisioning="queued", queued_tier="guaranteed")
    tpu.ensure_node(cfg, NAME, tpu.labels("run-q", 1))
    while not tpu.ensure_node(cfg, NAME, {}).ready:
        pass
    assert "guaranteed" in fake_tpu.queued_resource("proj", ZONE, NAME)
    assert tpu.delete_node(cfg, NAME)
    assert fake_tpu.node("proj", ZONE, NAME) is None and fake_tpu.queued == {}
    assert tpu.delete_node(cfg, NAME) is None  # gone: nothing to do


def test_the_fake_refuses_what_the_api_refuses_of_a_request(fake_tpu):
    from google.cloud import tpu_v2

    cfg = _cfg(fake_tpu, provisioning="queued")
    node = tpu._new_node(cfg, {}, None)
    api = tpu.client(cfg)
    bad = queued.request(cfg, NAME, node)
    bad.reservation_name = "projects/p/locations/z/reservations/r"  # a reservation is not on the Spot tier
    with pytest.raises(BadRequest, match="guaranteed tier"):
        api.create_queued_resource(parent=tpu.parent(cfg), queued_resource_id=NAME, queued_resource=bad)
    spot_node = tpu_v2.Node(node)
    spot_node.scheduling_config = tpu_v2.SchedulingConfig(spot=True)
    with pytest.raises(BadRequest, match="not on its node"):
        queued.create(cfg, NAME, spot_node)
    queued.create(cfg, NAME, node)
    while not tpu.ensure_node(cfg, NAME, {}).ready:
        pass
    with pytest.raises(BadRequest, match="delete node .* first, or use force"):
        api.delete_queued_resource(name=queued.full_name(cfg, NAME))


def test_config_spot_reads_as_provisioning_and_a_reservation_needs_the_guaranteed_tier():
    assert TpuConfig(spot=True).provisioning == "spot" and TpuConfig(spot=False).provisioning == "on_demand"
    with pytest.raises(ValueError, match="disagree: set tpu.provisioning only"):
        TpuConfig(spot=True, provisioning="queued")
    reservation = "projects/p/locations/us-central2-b/reservations/r"
    with pytest.raises(ValueError, match="tpu.reservation is for tpu.provisioning=queued"):
        TpuConfig(provisioning="queued", reservation=reservation)
    held = TpuConfig(provisioning="queued", queued_tier="guaranteed", reservation=reservation)
    assert not held.spot and held.create_wait_s() == 24 * 3600 + held.create_timeout_s
