"""A fake of the Cloud TPU v2 REST API on 127.0.0.1, as strict as Google's, for the real google-cloud-tpu client.

    with OAuthTokenServer() as oauth, FakeTpuApi(oauth=oauth, endpoint_port=2222) as api:
        creds = service_account.Credentials.from_service_account_info(oauth.new_service_account(...), ...)
        client = TpuClient(transport="rest", credentials=creds, client_options={"api_endpoint": api.url})

Speaks what `google.cloud.tpu_v2` sends over REST (see its transports/rest_base.py): nodes create
(POST .../nodes?nodeId=), get, list (pageSize/pageToken), patch (updateMask), delete, getGuestAttributes
(POST .../nodes/<id>:getGuestAttributes), queued resources create (POST .../queuedResources?queuedResourceId=),
get, list and delete (?force=), and operations get, with camelCase JSON and `{"error": {"code",
"message", "status"}}` errors (400 -> InvalidArgument,
401/403, 404 -> NotFound, 409 -> Conflict, 429 -> TooManyRequests, 503 -> ServiceUnavailable).

What it holds callers to, as the real API does:
- auth: every request needs `Authorization: Bearer` with a token the OAuth peer issued, or the
  self-signed service-account JWT that google-cloud-tpu actually sends for a key (GAPIC clients sign
  their own JWT instead of calling the token endpoint; its signature is checked against the registered
  key), else 401 UNAUTHENTICATED; without the cloud-platform scope 403 PERMISSION_DENIED.
- create: a valid node id; acceleratorType `<generation>-<size>` of a real size; runtimeVersion
  present, and for TensorFlow runtimes `-pod` exactly when the type is multi-host; labels (at most
  64, keys `[a-z][-_a-z0-9]{0,62}`, values `[-_a-z0-9]{0,63}`); metadata (keys `[-_a-zA-Z0-9]{1,128}`,
  values <= 256 KiB, 512 KiB in all, enable-oslogin TRUE/FALSE, ssh-keys lines `user:type key [comment]`);
  serviceAccount scopes are URLs; not both spot and preemptible; no unknown fields.
- one network endpoint per host of the accelerator type; with networkConfig.enableExternalIps
  false no endpoint has an accessConfig (no external IP).
- a node is CREATING for `ready_after_gets` reads of it or its operation (default 3: with the
  operator's poll every 15 s, 45 s to a minute, the lower end of what a v4-8 takes), then READY.
- the first create and the first delete of each node are answered 429 RESOURCE_EXHAUSTED, then 503
  UNAVAILABLE, before they go through (`transient_errors=False` turns that off).
- patch: only `labels` in the update mask, with the same label rules.
- queued resources: one node spec (parent = the request's, a valid nodeId, the node as a create checks it,
  no Spot in its schedulingConfig: the tier is the request's), one tier (spot or guaranteed), one
  queueingPolicy constraint (durations as "3600s"), a reservation name of its form and only on the
  guaranteed tier; no unknown fields. Reads move a request along: ACCEPTED, WAITING_FOR_RESOURCES for
  `queue_gets` reads, PROVISIONING (its node made, CREATING as any), ACTIVE when the node is READY;
  FAILED (failedData.error) past its validUntilDuration or after `fail_next_queued(reason)`; SUSPENDED
  when its node is preempted or deleted. A delete without force of a request that has a node is 400
  FAILED_PRECONDITION; with force the node goes too. The create operation is done once accepted.
- getGuestAttributes: a known node (404), only queryPath and workerIds in the body, each worker id a
  0-based index below the node's host count (400); one GuestAttributes per worker asked for (all when
  none), holding the entries under queryPath (`ns/` or `ns/key`, '' or '/' for all). A READY node's
  workers publish `host_keys` in namespace `hostkeys` as the guest agent does (type -> base64 key);
  the `fake_tpu` fixture sets them to the test sshd's host key when the test uses `sshd`. A path with
  nothing under it is a 404 NOT_FOUND, as the Compute API answers before the agent has published
  (`guest_attributes_absent = "empty"`: an empty 200 instead). `refuse_guest_attributes(code, status)`
  answers every read with that error, as an enforced compute.disableGuestAttributesAccess policy or a
  missing permission would (the exact status of the policy's refusal is not documented: 403 and 400
  are both tested).

Leniencies left, and why:
- REST only: production uses the client's gRPC transport by default; the tests set tpu.transport=rest,
  which drives the same client methods, retries and credentials (a gRPC fake would need TLS and protos).
- all workers share `endpoint_ip` (the test's one sshd) and the external IP is `external_ip`, not
  distinct addresses: loopback tests have one SSH server.
- runtime versions are not checked against Google's list of existing runtimes (that list changes;
  mlm_tasks' runtime table is checked against it instead), nor against the generation.
- quota, capacity and zone availability of a type are not modelled (`fail_next_create` injects a
  failed create by its code: a stockout, no reserved capacity, a Spot node preempted before READY;
  `refuse_next_create` a quota's 429); IAM roles are not modelled (any registered service account may do anything):
  `refuse_delete` stands in for a missing permission (403) or an API fault (500) on one node.
- acceleratorConfig (type + topology) is not modelled and is refused: mlm_tasks never sends it.
- network/subnetwork names are not resolved (there is no VPC here); ssh-keys key material is not parsed.
- every worker of every node publishes the same `host_keys` (one sshd again); a node that is not READY
  publishes none, an assumption (its guest agent is not running) rather than observed API behaviour.
- operations finish on reads, not on a clock (`ready_after_s` adds a clock where a test needs one).
Tests steer it with `preempt`, `set_state`, `fail_next_create`, `refuse_delete` (every delete of one
node answered 403 PERMISSION_DENIED, or 500 INTERNAL: errors the client does not retry), `add_node`
(a node made elsewhere) and `workers` (endpoints per node, overriding the type's host count, for tests that
add nodes).
`stall()` makes it a hung API: every request (or those of the HTTP methods named, `stall("POST")`) is
read and then left unanswered, the connection open as behind a dead proxy, until `unstall()` or stop,
so a caller without a timeout hangs.
`refuse_deletes(code, status, message)` answers every delete with that error (e.g. 403
PERMISSION_DENIED), as the API does for a caller without tpu.nodes.delete.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from peers.loopback_http import LoopbackServer

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
QR_FIELDS = {"tpu", "spot", "guaranteed", "queueingPolicy", "reservationName"}  # what a create may send
QUEUEING_FIELDS = {"validUntilDuration", "validUntilTime", "validAfterDuration", "validAfterTime", "validInterval"}
RESERVATION = re.compile(r"projects/[^/]+/locations/[^/]+/reservations/[^/]+")
DURATION = re.compile(r"\d+(\.\d{1,9})?s")
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
PARENT = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/:]+)"
SERVICE_AUDIENCE = "https://tpu.googleapis.com/"
NODE_FIELDS = {
    "name",
    "description",
    "acceleratorType",
    "state",
    "healthDescription",
    "runtimeVersion",
    "networkConfig",
    "networkConfigs",
    "cidrBlock",
    "serviceAccount",
    "createTime",
    "schedulingConfig",
    "networkEndpoints",
    "health",
    "labels",
    "metadata",
    "tags",
    "id",
    "dataDisks",
    "apiVersion",
    "symptoms",
    "shieldedInstanceConfig",
    "acceleratorConfig",
    "queuedResource",
    "multisliceNode",
    "bootDiskConfig",
    "upcomingMaintenance",
}
# generation -> (type-suffix units per host beyond one host, largest one-host suffix, allowed suffixes)
GENERATIONS = {
    "v2": (8, 8, range(8, 513, 8)),
    "v3": (8, 8, range(8, 2049, 8)),
    "v4": (8, 8, range(8, 8193, 8)),
    "v5p": (8, 8, range(8, 12289, 8)),
    "v5litepod": (4, 8, (1, 4, 8, 16, 32, 64, 128, 256)),
    "v6e": (4, 8, (1, 4, 8, 16, 32, 64, 128, 256)),
}
LABEL_KEY = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE = re.compile(r"[-_a-z0-9]{0,63}")
METADATA_KEY = re.compile(r"[-_a-zA-Z0-9]{1,128}")
SSH_KEY_LINE = re.compile(r"[^:\s]+:(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]+( \S.*)?")


def hosts_of(accelerator_type: str) -> int | None:
    """Hosts of a slice of this type, or None if the API does not know the type."""
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator_type or "")
    if not match or match[1] not in GENERATIONS:
        return None
    per_host, one_host, sizes = GENERATIONS[match[1]]
    size = int(match[2])
    if size not in sizes:
        return None
    return 1 if size <= one_host else size // per_host


class InvalidRequest(Exception):
    """400 INVALID_ARGUMENT with this message."""


class FakeTpuApi(LoopbackServer):
    def __init__(
        self,
        *,
        oauth=None,
        ready_after_gets: int = 3,
        ready_after_s: float | None = None,
        endpoint_ip: str = "127.0.0.1",
        external_ip: str | None = None,
        endpoint_port: int = 8470,
        delete_after_gets: int = 0,
        transient_errors: bool = True,
    ):
        self.oauth = oauth  # OAuthTokenServer that vouches for bearer tokens
        self.ready_after_gets = ready_after_gets
        self.delete_after_gets = delete_after_gets  # reads a node stays DELETING before it is gone
        self.ready_after_s = ready_after_s
        self.endpoint_ip = endpoint_ip
        self.external_ip = external_ip or endpoint_ip
        self.endpoint_port = endpoint_port
        self.transient_errors = transient_errors
        self.workers: int | None = None  # test control: endpoints per node instead of the type's hosts
        self.host_keys: dict[str, str] = {}  # test control: what READY nodes' guest agents publish
        self.guest_attributes_absent = "404"  # test control: "404" or "empty", the answer when none are
        self._guest_attributes_refused: tuple[int, str] | None = None
        self.nodes: dict[str, dict] = {}  # full node name -> node JSON (+ private "_" keys)
        self.queued: dict[str, dict] = {}  # full queued resource name -> its JSON (+ private "_" keys)
        self.queue_gets = 2  # test control: reads a request spends WAITING_FOR_RESOURCES before it provisions
        self._queue_fail: str | None = None  # test control: the next request FAILS with this reason
        self.operations: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of requests past auth and busy answers
        self.answers: list[tuple[str, str, int]] = []  # (method, path, status) of every request
        self.principals: set[str] = set()  # service accounts whose requests got through auth
        self._fail_next: list[tuple[str, str, int]] = []  # one (message, node state, code) per create to fail
        self._refuse_create: str | None = None
        self._refuse_delete: dict[str, tuple[int, dict]] = {}  # full node name -> error answer
        self._answering = threading.Event()  # cleared by stall(): requests wait, unanswered
        self._answering.set()
        self._stalled_methods: tuple[str, ...] = ()  # empty: all of them
        self._refuse_all_deletes: tuple[int, str, str] | None = None
        self._transient: dict[tuple[str, str], int] = {}  # (verb, node) -> attempts seen
        self._lock = threading.RLock()
        self._ops = 0
        super().__init__(_handler(self))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- test controls ---------------------------------------------------------------------------
    def node(self, project: str, zone: str, node_id: str) -> dict | None:
        with self._lock:
            return self.nodes.get(f"projects/{project}/locations/{zone}/nodes/{node_id}")

    def set_state(self, node_id: str, state: str) -> None:
        """Force the state of the node named `node_id` (any project/zone) from now on."""
        with self._lock:
            for name, node in self.nodes.items():
                if name.endswith(f"/nodes/{node_id}"):
                    node["state"] = state
                    node["_pinned"] = True
                    return
        raise KeyError(node_id)

    def preempt(self, node_id: str) -> None:
        self.set_state(node_id, "PREEMPTED")

    def fail_next_create(
        self,
        message: str = "There is no more capacity in the zone",
        node_state: str = "TERMINATED",
        times: int = 1,
        code: int = 8,
    ) -> None:
        """The next `times` creates each make the node (CREATING), then fail its operation with google.rpc
        `code` when it would turn READY: 8 RESOURCE_EXHAUSTED (a stockout that lasts `times` creates), 9
        FAILED_PRECONDITION (no reserved capacity), 3 INVALID_ARGUMENT with node_state PREEMPTED (a Spot
        node taken back before it was READY)."""
        self._fail_next = [(message, node_state, code)] * times

    def refuse_next_create(self, message: str) -> None:
        """The next create is refused at once with 429 RESOURCE_EXHAUSTED and `message` (a quota naming its
        limit, as Google answers when the project's TPU quota in the region is used up); nothing is made."""
        self._refuse_create = message

    def fail_next_queued(self, message: str = "Queued resource request expired before capacity was found.") -> None:
        """The next queued resource waits, then FAILS with this reason instead of provisioning (its
        validUntilDuration ran out, or the request could not be honoured)."""
        self._queue_fail = message

    def queued_resource(self, project: str, zone: str, qr_id: str) -> dict | None:
        with self._lock:
            return self.queued.get(f"projects/{project}/locations/{zone}/queuedResources/{qr_id}")

    def refuse_guest_attributes(self, code: int = 403, status: str = "PERMISSION_DENIED") -> None:
        """Every getGuestAttributes answered with this error (an organisation policy, a missing permission)."""
        self._guest_attributes_refused = (code, status)

    def refuse_delete(self, project: str, zone: str, node_id: str, code: int = 403) -> None:
        """Every delete of this node is refused, as the API does for a caller without tpu.nodes.delete
        on it (403) or in an outage (500); reads and lists still see the node."""
        answers = {
            403: ("PERMISSION_DENIED", f"Permission 'tpu.nodes.delete' denied on node {node_id}."),
            500: ("INTERNAL", "Internal error encountered."),
        }
        if code not in answers:
            raise ValueError(f"refuse_delete answers 403 or 500, not {code}")
        with self._lock:
            name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            self._refuse_delete[name] = _error(code, *answers[code])

    def add_node(
        self,
        project: str,
        zone: str,
        node_id: str,
        *,
        state: str = "READY",
        labels: dict | None = None,
        accelerator_type: str = "v4-8",
    ) -> dict:
        """Put a node in place without going through create (e.g. one left by an earlier run)."""
        with self._lock:
            node = self._new_node(
                f"projects/{project}/locations/{zone}",
                node_id,
                {
                    "labels": labels or {},
                    "acceleratorType": accelerator_type,
                    "runtimeVersion": "tpu-vm-tf-2.16.1-pjrt",
                    "networkConfig": {"enableExternalIps": True},
                },
            )
            node.update(state=state, _pinned=True)
            return node

    def stall(self, *methods: str) -> None:
        """From now on, leave every request (of these HTTP methods) unanswered until unstall() or stop()."""
        self._stalled_methods = methods
        self._answering.clear()

    def unstall(self) -> None:
        self._answering.set()

    def stop(self) -> None:
        self._answering.set()  # never leave a handler thread parked on a stalled request
        super().stop()

    def refuse_deletes(
        self,
        code: int = 403,
        status: str = "PERMISSION_DENIED",
        message: str = "Permission 'tpu.nodes.delete' denied on resource.",
    ) -> None:
        """Answer every delete from now on with this error (None for code: accept them again)."""
        self._refuse_all_deletes = (code, status, message) if code else None

    def writes(self) -> list[str]:
        """Methods of the create/patch/delete requests that went through, in order."""
        return [m for m, path in self.requests if m in ("POST", "PATCH", "DELETE") and not is_read(path)]

    # -- API behaviour ---------------------------------------------------------------------------
    def _new_node(self, parent: str, node_id: str, body: dict) -> dict:
        name = f"{parent}/nodes/{node_id}"
        external = (body.get("networkConfig") or {}).get("enableExternalIps", False)
        endpoint = {"ipAddress": self.endpoint_ip, "port": self.endpoint_port}
        if external:
            endpoint["accessConfig"] = {"externalIp": self.external_ip}
        count = self.workers or hosts_of(body["acceleratorType"]) or 1
        endpoints = [dict(endpoint) for _ in range(count)]
        node = {
            **body,
            "name": name,
            "state": "CREATING",
            "networkEndpoints": endpoints,
            "apiVersion": "V2",
            # With a fraction, as Google's: a node replaced in the same second is still another createTime.
            "createTime": _rfc3339(time.time_ns()),
            "_gets": 0,
            "_created": time.monotonic(),
            "_fail": self._fail_next.pop(0) if self._fail_next else None,
            "_pinned": False,
        }
        self.nodes[name] = node
        return node

    def _busy(self, verb: str, name: str) -> tuple[int, dict] | None:
        """The first attempt of each create/delete of a node gets 429, the second 503 (a busy API)."""
        if not self.transient_errors:
            return None
        seen = self._transient.get((verb, name), 0)
        self._transient[(verb, name)] = seen + 1
        if seen == 0:
            return _error(
                429,
                "RESOURCE_EXHAUSTED",
                "Quota exceeded for quota metric 'Requests' of service 'tpu.googleapis.com'. Please retry.",
            )
        if seen == 1:
            return _error(503, "UNAVAILABLE", "The service is currently unavailable.")
        return None

    def _advance(self, node: dict) -> None:
        """A read of a CREATING node moves its clock; READY (or failure) once the clock runs out."""
        if node["state"] == "DELETING":
            node["_delete_gets"] -= 1
            if node["_delete_gets"] <= 0:
                self.nodes.pop(node["name"], None)
            return
        if node["_pinned"] or node["state"] != "CREATING":
            return
        node["_gets"] += 1
        done = node["_gets"] >= self.ready_after_gets or (
            self.ready_after_s is not None and time.monotonic() - node["_created"] >= self.ready_after_s
        )
        if not done:
            return
        if node["_fail"]:
            message, state, code = node["_fail"]
            node["state"] = state
            node["_error"] = {"code": code, "message": message}
        else:
            node["state"] = "READY"
            if node.get("queuedResource") in self.queued:  # the request that made it is fulfilled
                self.queued[node["queuedResource"]]["state"] = {"state": "ACTIVE", "activeData": {}}

    def _new_queued(self, parent: str, qr_id: str, body: dict) -> dict:
        qr = {
            **body,
            "name": f"{parent}/queuedResources/{qr_id}",
            "createTime": _rfc3339(time.time_ns()),
            "state": {"state": "ACCEPTED", "acceptedData": {}},
            "_gets": 0,
            "_created": time.monotonic(),
            "_fail": self._queue_fail,
        }
        self._queue_fail = None
        self.queued[qr["name"]] = qr
        return qr

    def _advance_queued(self, qr: dict) -> None:
        """A read of a request moves it along: ACCEPTED, WAITING_FOR_RESOURCES for `queue_gets` reads (or
        past its validUntilDuration: FAILED), PROVISIONING (its node made, CREATING), ACTIVE once the node
        is READY; SUSPENDED when its node is preempted or deleted."""
        state = qr["state"]["state"]
        spec = qr["tpu"]["nodeSpec"][0]
        node_name = f"{spec['parent']}/nodes/{spec['nodeId']}"
        node = self.nodes.get(node_name)
        if state == "DELETING":
            qr["_delete_gets"] -= 1
            if qr["_delete_gets"] <= 0:
                self.queued.pop(qr["name"], None)
        elif state == "ACCEPTED":
            qr["state"] = {"state": "WAITING_FOR_RESOURCES", "waitingForResourcesData": {}}
        elif state == "WAITING_FOR_RESOURCES":
            qr["_gets"] += 1
            valid_s = float(qr.get("queueingPolicy", {}).get("validUntilDuration", "inf").rstrip("s"))
            if qr["_fail"] or time.monotonic() - qr["_created"] > valid_s:
                reason = qr["_fail"] or "The queued resource request expired (validUntilDuration)."
                qr["state"] = {"state": "FAILED", "failedData": {"error": {"code": 8, "message": reason}}}
            elif qr["_gets"] >= self.queue_gets:
                made = self._new_node(spec["parent"], spec["nodeId"], spec["node"])
                made["queuedResource"] = qr["name"]
                qr["state"] = {"state": "PROVISIONING", "provisioningData": {}}
        elif state in ("PROVISIONING", "ACTIVE"):
            if node is None or node["state"] in ("PREEMPTED", "TERMINATED"):
                qr["state"] = {"state": "SUSPENDED", "suspendedData": {}, "stateInitiator": "SERVICE"}
            elif node["state"] == "READY":
                qr["state"] = {"state": "ACTIVE", "activeData": {}}

    def _operation(self, parent: str, target: str, verb: str) -> dict:
        self._ops += 1
        name = f"{parent}/operations/operation-{self._ops}"
        op = {
            "name": name,
            "done": False,
            "_target": target,
            "_verb": verb,
            "metadata": {"@type": META_TYPE, "target": target, "verb": verb, "apiVersion": "v2"},
        }
        self.operations[name] = op
        return op

    def _refresh(self, op: dict) -> dict:
        if op["done"]:
            return op
        if "/queuedResources/" in op["_target"]:  # accepted at once; a delete is done when the request is gone
            qr = self.queued.get(op["_target"])
            if qr is not None:
                self._advance_queued(qr)
            if op["_verb"] == "create" or op["_target"] not in self.queued:
                op.update(done=True, response={"@type": QR_TYPE if op["_verb"] == "create" else EMPTY_TYPE})
            return op
        node = self.nodes.get(op["_target"])
        if op["_verb"] == "delete":
            if node is not None:
                self._advance(node)
            if op["_target"] not in self.nodes:
                op.update(done=True, response={"@type": EMPTY_TYPE})
        elif op["_verb"] == "update":
            op.update(done=True, response={"@type": NODE_TYPE, **_public(node or {})})
        elif node is None:
            op.update(done=True, error={"code": 10, "message": "The node was deleted during creation."})
        else:
            self._advance(node)
            if node.get("_error"):
                op.update(done=True, error={k: v for k, v in node["_error"].items() if k != "status"})
            elif node["state"] == "READY":
                op.update(done=True, response={"@type": NODE_TYPE, **_public(node)})
        return op


def _rfc3339(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def is_read(path: str) -> bool:
    """getGuestAttributes is a read although it is a POST."""
    return path.endswith(":getGuestAttributes")


def _page(objects: dict, prefix: str, key: str, query: dict) -> dict:
    """One page of a list answer (pageSize/pageToken, the token an offset), as the API pages them."""
    names = sorted(n for n in objects if n.startswith(prefix))
    size = int((query.get("pageSize") or ["0"])[0]) or len(names) or 1
    start = int((query.get("pageToken") or ["0"])[0] or 0)
    more = start + size < len(names)
    page = {key: [_public(objects[n]) for n in names[start : start + size]]}
    return {**page, **({"nextPageToken": str(start + size)} if more else {})}


def _public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def check_labels(labels: dict) -> None:
    if len(labels) > 64:
        raise InvalidRequest(f"A node can have at most 64 labels, got {len(labels)}.")
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise InvalidRequest(
                f"Invalid label key {key!r}: keys must start with a lowercase letter and "
                "contain only lowercase letters, digits, '-' and '_' (at most 63)."
            )
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            raise InvalidRequest(
                f"Invalid label value {value!r} for key {key!r}: lowercase letters, digits, "
                "'-' and '_' only, at most 63."
            )


def check_metadata(metadata: dict) -> None:
    total = 0
    for key, value in metadata.items():
        if not METADATA_KEY.fullmatch(key):
            raise InvalidRequest(f"Invalid metadata key {key!r}.")
        if not isinstance(value, str) or len(value.encode()) > 256 * 1024:
            raise InvalidRequest(f"Metadata value of {key!r} must be a string of at most 256 KiB.")
        total += len(key) + len(value.encode())
        if key == "enable-oslogin" and value.upper() not in ("TRUE", "FALSE"):
            raise InvalidRequest(f"Invalid value {value!r} for metadata enable-oslogin: TRUE or FALSE.")
        if key == "ssh-keys":
            for line in filter(None, value.splitlines()):
                if not SSH_KEY_LINE.fullmatch(line):
                    raise InvalidRequest(f"Invalid ssh-keys entry {line[:40]!r}: expected 'user:type key [comment]'.")
    if total > 512 * 1024:
        raise InvalidRequest("Metadata may hold at most 512 KiB in all.")


def check_node(body: dict) -> None:
    """What the API validates in a create request body (see the module docstring)."""
    unknown = set(body) - NODE_FIELDS
    if unknown:
        raise InvalidRequest(f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} at 'node'.")
    accelerator = body.get("acceleratorType", "")
    if not accelerator:
        raise InvalidRequest("Field 'acceleratorType' is required (this fake does not model acceleratorConfig).")
    host_count = hosts_of(accelerator)
    if host_count is None:
        raise InvalidRequest(
            f"Accelerator type {accelerator!r} is not valid: expected <generation>-<size> "
            "with a supported size, e.g. v4-8, v5litepod-8, v5p-8."
        )
    runtime = body.get("runtimeVersion", "")
    if not runtime:
        raise InvalidRequest("Field 'runtimeVersion' is required.")
    if runtime.startswith("tpu-vm-tf-"):
        pod = bool(re.search(r"-pod(-|$)", runtime))
        if host_count > 1 and not pod:
            raise InvalidRequest(
                f"Runtime version {runtime!r} supports single-host slices only; {accelerator} "
                f"has {host_count} hosts: use a TensorFlow -pod runtime version."
            )
        if host_count == 1 and pod:
            raise InvalidRequest(f"Runtime version {runtime!r} is for multi-host slices; {accelerator} is one host.")
    check_labels(body.get("labels") or {})
    check_metadata(body.get("metadata") or {})
    network = body.get("networkConfig") or {}
    if "enableExternalIps" in network and not isinstance(network["enableExternalIps"], bool):
        raise InvalidRequest("networkConfig.enableExternalIps must be a boolean.")
    account = body.get("serviceAccount") or {}
    if account.get("email") and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]+", account["email"]):
        raise InvalidRequest(f"Invalid service account email {account['email']!r}.")
    for scope in account.get("scope") or []:
        if not scope.startswith("https://www.googleapis.com/auth/"):
            raise InvalidRequest(f"Invalid service account scope {scope!r}.")
    scheduling = body.get("schedulingConfig") or {}
    if scheduling.get("spot") and scheduling.get("preemptible"):
        raise InvalidRequest("schedulingConfig: spot and preemptible cannot both be set.")


def check_queued(parent: str, body: dict) -> dict:
    """What the API validates in a queued resource create (one node spec here); returns the spec."""
    unknown = set(body) - QR_FIELDS
    if unknown:
        raise InvalidRequest(
            f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} at 'queued_resource'."
        )
    specs = (body.get("tpu") or {}).get("nodeSpec") or []
    if len(specs) != 1:
        raise InvalidRequest("tpu.nodeSpec must hold one node spec (this fake does not model multislice).")
    spec = specs[0]
    if set(spec) - {"parent", "nodeId", "node"}:
        raise InvalidRequest(f"Unknown field(s) {sorted(set(spec) - {'parent', 'nodeId', 'node'})} in tpu.nodeSpec.")
    if spec.get("parent") != parent:
        raise InvalidRequest(f"tpu.nodeSpec.parent {spec.get('parent')!r} must be the request's parent {parent!r}.")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", spec.get("nodeId", "")):
        raise InvalidRequest(f"Invalid node id {spec.get('nodeId')!r} in tpu.nodeSpec.")
    check_node(spec.get("node") or {})
    if (spec["node"].get("schedulingConfig") or {}).get("spot"):
        raise InvalidRequest("Set the Spot tier on the queued resource (spot: {}), not on its node's schedulingConfig.")
    if "spot" in body and "guaranteed" in body:
        raise InvalidRequest("A queued resource has one tier: spot or guaranteed.")
    policy = body.get("queueingPolicy") or {}
    if set(policy) - QUEUEING_FIELDS or len(policy) > 1:
        raise InvalidRequest(f"queueingPolicy takes one of {sorted(QUEUEING_FIELDS)}, got {sorted(policy)}.")
    for key in ("validUntilDuration", "validAfterDuration"):
        if key in policy and not DURATION.fullmatch(str(policy[key])):
            raise InvalidRequest(f"queueingPolicy.{key} {policy[key]!r} is not a duration such as '3600s'.")
    reservation = body.get("reservationName", "")
    if reservation and not RESERVATION.fullmatch(reservation):
        raise InvalidRequest(f"Invalid reservation name {reservation!r}: projects/P/locations/Z/reservations/R.")
    if reservation and "spot" in body:
        raise InvalidRequest("A reservation is provisioned on the guaranteed tier, not Spot.")
    return spec


def _handler(api: FakeTpuApi):
    routes = [
        ("POST", re.compile(PARENT + r"/nodes$"), "create"),
        ("GET", re.compile(PARENT + r"/nodes$"), "list"),
        ("GET", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+)$"), "get"),
        ("PATCH", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+)$"), "patch"),
        ("DELETE", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+)$"), "delete"),
        ("GET", re.compile(PARENT + r"/operations/(?P<op>[^/:]+)$"), "operation"),
        ("POST", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+):getGuestAttributes$"), "guest_attributes"),
        ("POST", re.compile(PARENT + r"/queuedResources$"), "create_queued"),
        ("GET", re.compile(PARENT + r"/queuedResources$"), "list_queued"),
        ("GET", re.compile(PARENT + r"/queuedResources/(?P<qr>[^/:]+)$"), "get_queued"),
        ("DELETE", re.compile(PARENT + r"/queuedResources/(?P<qr>[^/:]+)$"), "delete_queued"),
    ]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output readable
            pass

        def _route(self, method: str, url, query: dict, body: dict) -> tuple[int, dict]:
            if api.oauth is None:
                return _error(401, "UNAUTHENTICATED", "No OAuth peer: this fake accepts no credentials.")
            denied, email = api.oauth.check(self.headers.get("Authorization"), SERVICE_AUDIENCE)
            if denied:
                return _error(*denied)
            api.principals.add(email)
            for verb, pattern, action in routes:
                match = pattern.match(url.path)
                if verb == method and match:
                    with api._lock:
                        try:
                            return getattr(self, action)(match.groupdict(), query, body)
                        except InvalidRequest as err:
                            return _error(400, "INVALID_ARGUMENT", str(err))
            return _error(404, "NOT_FOUND", f"No route for {method} {url.path}")

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            if not api._answering.is_set() and method in (api._stalled_methods or (method,)):
                api._answering.wait(timeout=120)  # stalled: this request never gets an answer
                self.close_connection = True
                return
            code, payload = self._route(method, url, query, body)
            api.answers.append((method, url.path, code))
            if code not in (401, 403, 429, 503):  # refused before the API looked at it
                api.requests.append((method, url.path))
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = lambda self: self._serve("GET")  # noqa: E731
        do_POST = lambda self: self._serve("POST")  # noqa: E731
        do_PATCH = lambda self: self._serve("PATCH")  # noqa: E731
        do_DELETE = lambda self: self._serve("DELETE")  # noqa: E731

        @staticmethod
        def _parent(g: dict) -> str:
            return f"projects/{g['project']}/locations/{g['zone']}"

        def create(self, g, query, body):
            node_id = (query.get("nodeId") or [""])[0]
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", node_id):
                return _error(400, "INVALID_ARGUMENT", f"Invalid node id {node_id!r}.")
            check_node(body)
            parent = self._parent(g)
            if f"{parent}/nodes/{node_id}" in api.nodes:
                return _error(409, "ALREADY_EXISTS", f"Node {node_id} already exists.")
            if api._refuse_create:
                message, api._refuse_create = api._refuse_create, None
                return _error(429, "RESOURCE_EXHAUSTED", message)
            busy = api._busy("create", f"{parent}/nodes/{node_id}")
            if busy:
                return busy
            node = api._new_node(parent, node_id, body)
            return 200, _public(api._operation(parent, node["name"], "create"))

        def get(self, g, query, body):
            name = f"{self._parent(g)}/nodes/{g['node']}"
            if name in api.nodes:
                api._advance(api.nodes[name])
            if name not in api.nodes:  # also when this read ended a DELETING
                return _error(404, "NOT_FOUND", f"Node {g['node']} not found.")
            return 200, _public(api.nodes[name])

        def list(self, g, query, body):
            return 200, _page(api.nodes, self._parent(g) + "/nodes/", "nodes", query)

        def patch(self, g, query, body):
            name = f"{self._parent(g)}/nodes/{g['node']}"
            mask = [p for p in ",".join(query.get("updateMask") or []).split(",") if p]
            if not mask:
                raise InvalidRequest("updateMask is required.")
            if set(mask) - {"labels"}:  # what the API lets one change on a running node that we use
                raise InvalidRequest(
                    f"Field(s) {sorted(set(mask) - {'labels'})} cannot be updated; supported here: labels."
                )
            if name not in api.nodes:
                return _error(404, "NOT_FOUND", f"Node {g['node']} not found.")
            check_labels(body.get("labels") or {})
            api.nodes[name]["labels"] = dict(body.get("labels") or {})
            return 200, _public(api._operation(self._parent(g), name, "update"))

        def delete(self, g, query, body):
            name = f"{self._parent(g)}/nodes/{g['node']}"
            if name in api._refuse_delete:  # IAM is checked before the node is looked up
                return api._refuse_delete[name]
            if name not in api.nodes:
                return _error(404, "NOT_FOUND", f"Node {g['node']} not found.")
            if api._refuse_all_deletes:
                return _error(*api._refuse_all_deletes)
            busy = api._busy("delete", name)
            if busy:
                return busy
            node = api.nodes[name]
            if api.delete_after_gets:  # the real API lingers in DELETING for a while
                node.update(state="DELETING", _pinned=True, _delete_gets=api.delete_after_gets)
            else:
                del api.nodes[name]
            return 200, _public(api._operation(self._parent(g), name, "delete"))

        def guest_attributes(self, g, query, body):
            name = f"{self._parent(g)}/nodes/{g['node']}"
            if name not in api.nodes:
                return _error(404, "NOT_FOUND", f"Node {g['node']} not found.")
            unknown = set(body) - {"queryPath", "workerIds"}
            if unknown:
                raise InvalidRequest(f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r}.")
            if api._guest_attributes_refused:
                code, status = api._guest_attributes_refused
                return _error(code, status, "Guest attributes access is disabled for this project.")
            node = api.nodes[name]
            hosts = len(node["networkEndpoints"])
            ids = body.get("workerIds") or [str(i) for i in range(hosts)]
            for worker in ids:
                if not (isinstance(worker, str) and worker.isdigit() and int(worker) < hosts):
                    raise InvalidRequest(
                        f"Invalid worker id {worker!r}: node {g['node']} has workers 0 to {hosts - 1}."
                    )
            path = body.get("queryPath", "")
            namespace, _, key = path.strip("/").partition("/")
            published = api.host_keys if node["state"] == "READY" else {}  # no guest agent runs otherwise
            items = [
                {"namespace": "hostkeys", "key": k, "value": v}
                for k, v in published.items()
                if namespace in ("", "hostkeys") and key in ("", k)
            ]
            if not items and api.guest_attributes_absent == "404":
                return _error(404, "NOT_FOUND", f"The resource '{name}/guestAttributes/{path}' was not found")
            value = {"items": items} if items else {}
            return 200, {"guestAttributes": [{"queryPath": path, "queryValue": value} for _ in ids]}

        def create_queued(self, g, query, body):
            qr_id = (query.get("queuedResourceId") or [""])[0]
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", qr_id):
                return _error(400, "INVALID_ARGUMENT", f"Invalid queued resource id {qr_id!r}.")
            parent = self._parent(g)
            spec = check_queued(parent, body)
            if f"{parent}/queuedResources/{qr_id}" in api.queued:
                return _error(409, "ALREADY_EXISTS", f"Queued resource {qr_id} already exists.")
            if f"{parent}/nodes/{spec['nodeId']}" in api.nodes:
                return _error(409, "ALREADY_EXISTS", f"Node {spec['nodeId']} already exists.")
            qr = api._new_queued(parent, qr_id, body)
            return 200, _public(api._operation(parent, qr["name"], "create"))

        def get_queued(self, g, query, body):
            name = f"{self._parent(g)}/queuedResources/{g['qr']}"
            if name in api.queued:
                api._advance_queued(api.queued[name])
            if name not in api.queued:
                return _error(404, "NOT_FOUND", f"Queued resource {g['qr']} not found.")
            return 200, _public(api.queued[name])

        def list_queued(self, g, query, body):
            return 200, _page(api.queued, self._parent(g) + "/queuedResources/", "queuedResources", query)

        def delete_queued(self, g, query, body):
            name = f"{self._parent(g)}/queuedResources/{g['qr']}"
            if name not in api.queued:
                return _error(404, "NOT_FOUND", f"Queued resource {g['qr']} not found.")
            qr = api.queued[name]
            spec = qr["tpu"]["nodeSpec"][0]
            node = f"{spec['parent']}/nodes/{spec['nodeId']}"
            force = (query.get("force") or ["false"])[0] == "true"
            if node in api.nodes and not force:
                return _error(
                    400,
                    "FAILED_PRECONDITION",
                    f"Queued resource {g['qr']} has a node: delete node {spec['nodeId']} first, or use force.",
                )
            api.nodes.pop(node, None)
            if api.delete_after_gets:
                qr.update(state={"state": "DELETING", "deletingData": {}}, _delete_gets=api.delete_after_gets)
            else:
                del api.queued[name]
            return 200, _public(api._operation(self._parent(g), name, "delete"))

        def operation(self, g, query, body):
            op = api.operations.get(f"{self._parent(g)}/operations/{g['op']}")
            if op is None:
                return _error(404, "NOT_FOUND", f"Operation {g['op']} not found.")
            return 200, _public(api._refresh(op))

    return Handler


try:
    import pytest
except ImportError:  # the fake also runs outside pytest
    pytest = None

if pytest is not None:
    GCP_CONN_ENV = "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"

    @pytest.fixture(scope="session")
    def oauth_server():
        from peers.oauth_token import OAuthTokenServer

        with OAuthTokenServer() as server:
            yield server

    @pytest.fixture(scope="session")
    def sa_key(oauth_server) -> dict:
        """A service-account key JSON whose token_uri is the loopback OAuth peer."""
        return oauth_server.new_service_account("mlm-airflow@mlm-test-project.iam.gserviceaccount.com")

    @pytest.fixture
    def fake_tpu(oauth_server, sa_key, monkeypatch, request, tmp_path_factory):
        """A fresh FakeTpuApi (nodes READY on the 3rd read) that takes only the OAuth peer's tokens; with
        the `sshd` fixture in the test, its nodes publish that sshd's host key (the login pins it).
        MLM_TPU_REGISTRY (the deployment's record of its nodes) is a fresh folder, `.registry`.

        The Airflow GCP connection google_cloud_default holds `sa_key` (env, so `dags test`
        subprocesses see it too); in-process code gets the same credentials via mlm_tasks.credentials."""
        from google.oauth2 import service_account

        from mlm_tasks import credentials

        registry = str(tmp_path_factory.mktemp("tpu-registry"))
        monkeypatch.setenv("MLM_TPU_REGISTRY", registry)
        monkeypatch.setenv(
            GCP_CONN_ENV,
            json.dumps({"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(sa_key)}}),
        )
        creds = service_account.Credentials.from_service_account_info(
            sa_key, scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
        with FakeTpuApi(oauth=oauth_server) as api, credentials.use(creds, sa_key["project_id"], "test key"):
            api.credentials = creds
            api.registry = registry
            if "sshd" in request.fixturenames:
                from peers.sshd import host_public_key

                api.host_keys = dict([host_public_key(request.getfixturevalue("sshd"))])
            yield api
