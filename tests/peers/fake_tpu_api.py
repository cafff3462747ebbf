"""A small fake of the Cloud TPU v2 REST API on 127.0.0.1, for the real google-cloud-tpu client.

    with FakeTpuApi(ready_after_gets=2, endpoint_ip="127.0.0.1", endpoint_port=2222) as api:
        client = TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options={"api_endpoint": api.url})

Speaks what `google.cloud.tpu_v2` sends over REST (see its transports/rest_base.py): nodes create
(POST .../nodes?nodeId=), get, list (pageSize/pageToken), delete, and operations get, with camelCase
JSON and `{"error": {"code", "message", "status"}}` errors (404 -> NotFound, 409 -> Conflict).
A node starts CREATING and turns READY after `ready_after_gets` reads of it or its operation, or
after `ready_after_s` seconds. Tests steer it with `preempt`, `set_state` and `fail_next_create`.
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
PARENT = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/:]+)"


class FakeTpuApi:
    def __init__(self, *, ready_after_gets: int = 1, ready_after_s: float | None = None,
                 endpoint_ip: str = "127.0.0.1", endpoint_port: int = 8470, workers: int = 1,
                 delete_after_gets: int = 0):
        self.ready_after_gets = ready_after_gets
        self.delete_after_gets = delete_after_gets  # reads a node stays DELETING before it is gone
        self.ready_after_s = ready_after_s
        self.endpoint_ip = endpoint_ip
        self.endpoint_port = endpoint_port
        self.workers = workers
        self.nodes: dict[str, dict] = {}      # full node name -> node JSON (+ private "_" keys)
        self.operations: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order
        self._fail_next: tuple[str, str] | None = None
        self._lock = threading.RLock()
        self._ops = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FakeTpuApi":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeTpuApi":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

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

    def fail_next_create(self, message: str = "There is no more capacity in the zone",
                         node_state: str = "TERMINATED") -> None:
        """The next create makes the node (CREATING), then fails its operation when it would turn READY."""
        self._fail_next = (message, node_state)

    def add_node(self, project: str, zone: str, node_id: str, *, state: str = "READY",
                 labels: dict | None = None) -> dict:
        """Put a node in place without going through create (e.g. one left by an earlier run)."""
        with self._lock:
            node = self._new_node(f"projects/{project}/locations/{zone}", node_id, {"labels": labels or {}})
            node.update(state=state, _pinned=True)
            return node

    # -- API behaviour ---------------------------------------------------------------------------
    def _new_node(self, parent: str, node_id: str, body: dict) -> dict:
        name = f"{parent}/nodes/{node_id}"
        endpoints = [{"ipAddress": self.endpoint_ip, "port": self.endpoint_port,
                      "accessConfig": {"externalIp": self.endpoint_ip}} for _ in range(self.workers)]
        node = {**body, "name": name, "state": "CREATING", "networkEndpoints": endpoints,
                "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "_gets": 0, "_created": time.monotonic(), "_fail": self._fail_next, "_pinned": False}
        self._fail_next = None
        self.nodes[name] = node
        return node

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
            self.ready_after_s is not None and time.monotonic() - node["_created"] >= self.ready_after_s)
        if not done:
            return
        if node["_fail"]:
            message, state = node["_fail"]
            node["state"] = state
            node["_error"] = {"code": 8, "message": message, "status": "RESOURCE_EXHAUSTED"}
        else:
            node["state"] = "READY"

    def _operation(self, parent: str, target: str, verb: str) -> dict:
        self._ops += 1
        name = f"{parent}/operations/operation-{self._ops}"
        op = {"name": name, "done": False, "_target": target, "_verb": verb,
              "metadata": {"@type": META_TYPE, "target": target, "verb": verb, "apiVersion": "v2"}}
        self.operations[name] = op
        return op

    def _refresh(self, op: dict) -> dict:
        if op["done"]:
            return op
        node = self.nodes.get(op["_target"])
        if op["_verb"] == "delete":
            if node is not None:
                self._advance(node)
            if op["_target"] not in self.nodes:
                op.update(done=True, response={"@type": EMPTY_TYPE})
        elif node is None:
            op.update(done=True, error={"code": 10, "message": "The node was deleted during creation."})
        else:
            self._advance(node)
            if node.get("_error"):
                op.update(done=True, error={k: v for k, v in node["_error"].items() if k != "status"})
            elif node["state"] == "READY":
                op.update(done=True, response={"@type": NODE_TYPE, **_public(node)})
        return op


def _public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _error(code: int, status: str, message: str) -> tuple[int, dict]:
    return code, {"error": {"code": code, "message": message, "status": status}}


def _handler(api: FakeTpuApi):
    routes = [
        ("POST", re.compile(PARENT + r"/nodes$"), "create"),
        ("GET", re.compile(PARENT + r"/nodes$"), "list"),
        ("GET", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+)$"), "get"),
        ("DELETE", re.compile(PARENT + r"/nodes/(?P<node>[^/:]+)$"), "delete"),
        ("GET", re.compile(PARENT + r"/operations/(?P<op>[^/:]+)$"), "operation"),
    ]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output readable
            pass

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            api.requests.append((method, url.path))
            for verb, pattern, action in routes:
                match = pattern.match(url.path)
                if verb == method and match:
                    with api._lock:
                        code, payload = getattr(self, action)(match.groupdict(), query, body)
                    break
            else:
                code, payload = _error(404, "NOT_FOUND", f"No route for {method} {url.path}")
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = lambda self: self._serve("GET")          # noqa: E731
        do_POST = lambda self: self._serve("POST")        # noqa: E731
        do_DELETE = lambda self: self._serve("DELETE")    # noqa: E731

        @staticmethod
        def _parent(g: dict) -> str:
            return f"projects/{g['project']}/locations/{g['zone']}"

        def create(self, g, query, body):
            node_id = (query.get("nodeId") or [""])[0]
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", node_id):
                return _error(400, "INVALID_ARGUMENT", f"Invalid node id {node_id!r}.")
            parent = self._parent(g)
            if f"{parent}/nodes/{node_id}" in api.nodes:
                return _error(409, "ALREADY_EXISTS", f"Node {node_id} already exists.")
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
            prefix = self._parent(g) + "/nodes/"
            names = sorted(n for n in api.nodes if n.startswith(prefix))
            size = int((query.get("pageSize") or ["0"])[0]) or len(names) or 1
            start = int((query.get("pageToken") or ["0"])[0] or 0)
            page = [_public(api.nodes[n]) for n in names[start:start + size]]
            more = start + size < len(names)
            return 200, {"nodes": page, **({"nextPageToken": str(start + size)} if more else {})}

        def delete(self, g, query, body):
            name = f"{self._parent(g)}/nodes/{g['node']}"
            if name not in api.nodes:
                return _error(404, "NOT_FOUND", f"Node {g['node']} not found.")
            node = api.nodes[name]
            if api.delete_after_gets:  # the real API lingers in DELETING for a while
                node.update(state="DELETING", _pinned=True, _delete_gets=api.delete_after_gets)
            else:
                del api.nodes[name]
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
    @pytest.fixture
    def fake_tpu():
        """A fresh FakeTpuApi (nodes READY on the 2nd read); point TpuConfig.api_endpoint at .url."""
        with FakeTpuApi(ready_after_gets=2) as api:
            yield api
