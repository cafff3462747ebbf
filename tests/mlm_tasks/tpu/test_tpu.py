"""mlm_tasks.tpu.api against the fake TPU v2 REST API, driven by the real google-cloud-tpu client with a
service-account key whose tokens come from the loopback OAuth peer."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.api_core.exceptions import BadRequest, NotFound

from mlm_tasks import credentials
from mlm_tasks.config import TpuConfig
from mlm_tasks.errors import AuthError, ConfigError, NoRetryError
from mlm_tasks.tpu import api as tpu
from mlm_tasks.tpu import slices as tpu_slices
from mlm_tasks.tpu import ssh

SSH_KEY = "mlm:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyMaterialForTheFakeOnly mlm"

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
    first = tpu.ensure_node(cfg, name, tpu.labels("run-1", 1), {"ssh-keys": SSH_KEY})
    assert (first.action, first.state) == ("created", "CREATING") and first.operation
    node = fake_tpu.node("proj", ZONE, name)
    assert node["acceleratorType"] == "v4-8" and node["labels"]["run"] == "run-1"
    # OS Login off (it would ignore ssh-keys), the cloud-platform scope set explicitly.
    assert node["metadata"] == {"ssh-keys": SSH_KEY, "enable-oslogin": "FALSE"}
    assert node["serviceAccount"] == {"scope": [tpu.SCOPE]}
    assert node["networkConfig"]["enableExternalIps"] is True

    assert [tpu.ensure_node(cfg, name, {}).action for _ in range(2)] == ["wait", "wait"]  # still CREATING
    second = tpu.ensure_node(cfg, name, {})  # 3rd read: READY in the fake
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

    def not_yet_visible(name, **_):  # the other try's node is not visible to our get yet
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
    assert [tpu.ensure_node(cfg, name, {}).state for _ in range(3)] == ["CREATING", "CREATING", "READY"]


def test_failed_create_reports_operation_error(cfg, fake_tpu):
    fake_tpu.fail_next_create("There is no more capacity in the zone")
    name = tpu.node_name("d", "r")
    op = tpu.ensure_node(cfg, name, {}).operation
    assert tpu.operation_error(cfg, op) is None  # first reads: still creating
    assert tpu.operation_error(cfg, op) is None
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


def test_one_endpoint_per_host_and_external_ips_only_when_asked(cfg, fake_tpu):
    fake_tpu.external_ip = "127.0.0.2"
    pod = cfg.model_copy(update={"accelerator_type": "v4-32", "runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt"})
    tpu.ensure_node(pod, "mlm-pod", {})
    fake_tpu.set_state("mlm-pod", "READY")
    state = tpu.get_state(pod, "mlm-pod")
    assert tpu.worker_endpoints(state) == ["127.0.0.1"] * 4  # v4-32: 4 hosts
    assert tpu.worker_endpoints(state, external=True) == ["127.0.0.2"] * 4

    internal = cfg.model_copy(update={"external_ips": False})
    tpu.ensure_node(internal, "mlm-internal", {})
    fake_tpu.set_state("mlm-internal", "READY")
    state = tpu.get_state(internal, "mlm-internal")
    assert fake_tpu.node("proj", ZONE, "mlm-internal")["networkConfig"].get("enableExternalIps", False) is False
    assert tpu.worker_endpoints(state) == ["127.0.0.1"]
    with pytest.raises(RuntimeError, match="without an external IP.*tpu.ssh_via=internal"):
        tpu.worker_endpoints(state, external=True)


def test_the_api_refuses_requests_without_the_connections_token(cfg, fake_tpu, oauth_server):
    import json
    import urllib.error
    import urllib.request

    from google.api_core.exceptions import Forbidden, Unauthorized
    from google.oauth2 import service_account

    # No Authorization header at all (google-auth will not even send anonymous REST calls).
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{fake_tpu.url}/v2/projects/proj/locations/{ZONE}/nodes")
    assert err.value.code == 401
    assert json.loads(err.value.read())["error"]["status"] == "UNAUTHENTICATED"
    # A key the OAuth peer never registered: its grant is refused, so no token reaches the API.
    from peers.oauth_token import OAuthTokenServer

    with OAuthTokenServer() as stranger_peer:
        stranger = stranger_peer.new_service_account("stranger@x.iam.gserviceaccount.com")
    stranger["token_uri"] = oauth_server.token_uri
    creds = service_account.Credentials.from_service_account_info(stranger, scopes=[tpu.SCOPE])
    with credentials.use(creds), pytest.raises(Unauthorized, match="invalid authentication credentials"):
        tpu.get_state(cfg, "mlm-x")
    # The right key with a scope that does not cover the API: 403.
    narrow = fake_tpu.credentials.with_scopes(["https://www.googleapis.com/auth/devstorage.read_only"])
    with credentials.use(narrow), pytest.raises(Forbidden, match="insufficient authentication scopes"):
        tpu.get_state(cfg, "mlm-x")
    assert fake_tpu.requests == [], "no refused request may reach the API"
    # The connection's key: let through.
    assert tpu.get_state(cfg, "mlm-x").state == tpu.NOT_FOUND


def test_create_and_delete_are_retried_through_429_and_503(cfg, fake_tpu):
    name = tpu.node_name("d", "retry")
    assert tpu.ensure_node(cfg, name, {}).action == "created"
    assert tpu.delete_node(cfg, name)
    for method in ("POST", "DELETE"):
        codes = [code for m, _, code in fake_tpu.answers if m == method]
        assert codes == [429, 503, 200], (method, codes)


def test_busy_api_is_not_retried_for_ever_nor_other_errors(cfg, fake_tpu):
    bad = cfg.model_copy(update={"accelerator_type": "v4-7"})  # validate would refuse this first
    with pytest.raises(BadRequest, match="Accelerator type 'v4-7' is not valid"):
        tpu.ensure_node(bad, "mlm-bad", {})
    assert [code for m, _, code in fake_tpu.answers if m == "POST"] == [400], "a 400 is final"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"accelerator_type": "v4-32"}, "supports single-host slices only; v4-32 has 4 hosts"),
        ({"runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt"}, "is for multi-host slices; v4-8 is one host"),
        ({"accelerator_type": "v5litepod-3"}, "Accelerator type 'v5litepod-3' is not valid"),
    ],
)
def test_the_fake_refuses_what_the_api_refuses(cfg, fake_tpu, change, message):
    with pytest.raises(BadRequest, match=re.escape(message)):
        tpu.ensure_node(cfg.model_copy(update=change), "mlm-bad", {})
    with pytest.raises(BadRequest, match="Invalid label key 'Run'"):
        tpu.ensure_node(cfg, "mlm-bad", {"Run": "x"})
    with pytest.raises(BadRequest, match="Invalid ssh-keys entry"):
        tpu.ensure_node(cfg, "mlm-bad", {}, {"ssh-keys": "u:k"})
    assert fake_tpu.nodes == {}


def test_reusing_a_node_moves_its_expires_label_later(cfg, fake_tpu):
    name = tpu.node_name("d", "long-run")
    fake_tpu.add_node("proj", ZONE, name, labels={"run": "long-run", "expires": str(int(time.time()) + 60)})
    fresh = tpu.labels("long-run", ttl_hours=12)
    assert tpu.ensure_node(cfg, name, fresh).action == "ready"
    node = fake_tpu.node("proj", ZONE, name)
    assert node["labels"] == {"run": "long-run", "expires": fresh["expires"]}  # only expires changed
    assert ("PATCH", f"/v2/projects/proj/locations/{ZONE}/nodes/{name}") in fake_tpu.requests
    # Already later than asked: nothing to update.
    patches = fake_tpu.writes().count("PATCH")
    assert tpu.ensure_node(cfg, name, tpu.labels("long-run", ttl_hours=1)).action == "ready"
    assert fake_tpu.writes().count("PATCH") == patches


@pytest.mark.parametrize(
    "accelerator, hosts",
    [
        ("v4-8", 1),
        ("v4-16", 2),
        ("v4-32", 4),
        ("v5p-8", 1),
        ("v5p-16", 2),
        ("v5litepod-1", 1),
        ("v5litepod-4", 1),
        ("v5litepod-8", 1),
        ("v5litepod-16", 4),
        ("v5litepod-256", 64),
        ("v3-8", 1),
        ("v3-32", 4),
        ("v2-8", 1),
    ],
)
def test_hosts_per_accelerator_type(accelerator, hosts):
    assert tpu_slices.hosts(accelerator) == hosts
    single, pod = "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.16.1-pod-pjrt"
    assert tpu_slices.check_runtime(accelerator, pod if hosts > 1 else single) == hosts
    with pytest.raises(ConfigError, match="-pod"):
        tpu_slices.check_runtime(accelerator, single if hosts > 1 else pod)


@pytest.mark.parametrize("accelerator, hosts", [("v6e-8", 1), ("v6e-16", 4)])
def test_v6e_shapes_are_known_but_refused_for_tensorflow(accelerator, hosts):
    assert tpu_slices.hosts(accelerator) == hosts
    with pytest.raises(ConfigError, match="TensorFlow is not supported on v6e"):
        tpu_slices.check_runtime(accelerator, "tpu-vm-tf-2.16.1-pod-pjrt" if hosts > 1 else "tpu-vm-tf-2.16.1-pjrt")


@pytest.mark.parametrize("accelerator", ["v4-7", "v4-12", "v5litepod-12", "v7-8", "v4", "V4-8", "v6e-512"])
def test_unknown_accelerator_types_are_config_errors(accelerator):
    with pytest.raises(ConfigError, match="tpu.accelerator_type"):
        tpu_slices.hosts(accelerator)


def test_importing_mlm_tasks_tpu_does_not_import_airflow():
    code = "import mlm_tasks.tpu.api, sys; assert 'airflow' not in sys.modules, 'airflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).parents[3]))


def test_host_keys_are_what_the_worker_published(cfg, fake_tpu):
    name = tpu.node_name("mlm_pretrain", "run-keys")
    fake_tpu.workers = 2
    fake_tpu.add_node("proj", ZONE, name)
    assert tpu.host_keys(cfg, name, worker=1) == {}  # the guest agent has not published them yet: a 404
    fake_tpu.guest_attributes_absent = "empty"
    assert tpu.host_keys(cfg, name, worker=1) == {}  # or an empty answer: the same
    fake_tpu.host_keys = {"ssh-ed25519": "AAAAC3Nz", "ssh-rsa": "AAAAB3Nz"}
    assert tpu.host_keys(cfg, name, worker=1) == {"ssh-ed25519": "AAAAC3Nz", "ssh-rsa": "AAAAB3Nz"}
    asked = [r for r in fake_tpu.requests if r[1].endswith(":getGuestAttributes")]
    assert asked == [("POST", f"/v2/projects/proj/locations/{ZONE}/nodes/{name}:getGuestAttributes")] * 3
    with pytest.raises(BadRequest, match="worker id '2'"):  # as the API: worker ids below the host count
        tpu.host_keys(cfg, name, worker=2)
    # A node that is gone publishes nothing either; published_keys asks its state (the next test).
    assert tpu.host_keys(cfg, "mlm-no-such-node", worker=0) == {}
    with pytest.raises(tpu.NodeNotReady, match="Node mlm-no-such-node is NOT_FOUND"):
        tpu.published_keys(cfg, "mlm-no-such-node")(0)


@pytest.mark.parametrize("code, status", [(403, "PERMISSION_DENIED"), (400, "FAILED_PRECONDITION")])
def test_guest_attributes_refused_fail_at_once_naming_the_policy_and_the_opt_out(cfg, fake_tpu, code, status):
    """An organisation that enforces compute.disableGuestAttributesAccess (or a connection without the
    permission): no host keys can be pinned, and no wait makes them appear. One ask, no retry."""
    name = tpu.node_name("mlm_pretrain", "run-no-guest-attributes")
    fake_tpu.add_node("proj", ZONE, name)
    fake_tpu.refuse_guest_attributes(code, status)
    connect = ssh.connector(
        lambda host: ssh.Login("mlm", "test", {}), 22, node=name, published=tpu.published_keys(cfg, name), poll_s=5
    )
    started = time.monotonic()
    with pytest.raises(AuthError) as err:
        connect("127.0.0.1")
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert "constraints/compute.disableGuestAttributesAccess" in message and "tpu.nodes.getGuestAttributes" in message
    assert '"no_host_key_check": true' in message and "anyone answering at the worker's IP is then trusted" in message
    assert isinstance(err.value, NoRetryError)
    assert [a[2] for a in fake_tpu.answers if a[1].endswith(":getGuestAttributes")] == [code]  # asked once


def test_published_keys_wait_on_a_ready_node_and_fail_at_once_on_a_preempted_one(cfg, fake_tpu):
    name = tpu.node_name("mlm_pretrain", "run-preempted-keys")
    fake_tpu.add_node("proj", ZONE, name)
    published = tpu.published_keys(cfg, name)
    assert published(0) == {}  # READY, agent still starting: the connector asks again
    fake_tpu.host_keys = {"ssh-ed25519": "AAAAC3Nz"}
    assert published(0) == {"ssh-ed25519": "AAAAC3Nz"}
    fake_tpu.preempt(name)  # a node that is not READY publishes none (see the fake's docstring)
    with pytest.raises(tpu.NodeNotReady, match=f"Node {name} is PREEMPTED"):
        published(0)
    # Through the connector: one ask, no wait of patience_s for keys that never come.
    connect = ssh.connector(
        lambda host: ssh.Login("mlm", "test", {}), 22, node=name, published=published, patience_s=600, poll_s=5
    )
    asked = len(fake_tpu.requests)
    with pytest.raises(tpu.NodeNotReady):
        connect("127.0.0.1")
    node = f"/v2/projects/proj/locations/{ZONE}/nodes/{name}"
    assert fake_tpu.requests[asked:] == [("POST", f"{node}:getGuestAttributes"), ("GET", node)]


def test_every_call_to_a_hung_api_fails_within_the_bound_saying_so(cfg, fake_tpu, monkeypatch):
    from google.api_core.exceptions import DeadlineExceeded

    from mlm_tasks.tpu import calls

    fake_tpu.add_node("proj", ZONE, "mlm-hung", labels={"expires": "1"})
    node = tpu.get_state(cfg, "mlm-hung")
    monkeypatch.setattr(calls, "API_TIMEOUT_S", 1.0)
    bounded = cfg
    fake_tpu.stall()
    calls = {
        "get_node": lambda: tpu.get_state(bounded, "mlm-hung"),
        "delete_node": lambda: tpu.delete_node(bounded, "mlm-hung"),
        "update_node": lambda: tpu.refresh_expiry(bounded, node, "99999999999"),
        "list_nodes": lambda: tpu.list_expired(bounded),
        "get_operation": lambda: tpu.operation_error(bounded, f"{tpu.parent(cfg)}/operations/operation-1"),
        "get_guest_attributes": lambda: tpu.host_keys(bounded, "mlm-hung"),
    }
    for what, call in calls.items():
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=rf"did not answer {what} .*within 1s"):
            call()
        assert time.monotonic() - started < 3, what
    fake_tpu.stall("POST")  # the get before the create is answered (NOT_FOUND); the create is not
    with pytest.raises(DeadlineExceeded, match=r"did not answer create_node mlm-new within"):
        tpu.ensure_node(bounded, "mlm-new", {})
