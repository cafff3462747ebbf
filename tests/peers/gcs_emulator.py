"""gcp-storage-emulator, plus the one GCS guarantee our code relies on that it lacks: preconditions.

    python tests/peers/gcs_emulator.py start --host 127.0.0.1 --port 9023 --in-memory

Same CLI and behaviour as `gcp-storage-emulator`, except that uploads honour `ifGenerationMatch`
the way real GCS does (412 Precondition Failed when it does not hold). Without that,
`storage.create_only` (first-writer-wins for the tokenizer) would pass its tests against the
emulator while never exercising the precondition it depends on in production. It also stores empty
media uploads (TensorFlow's `dir/` markers), which the emulator crashes on.

Clients are served concurrently, as GCS serves them: each connection has its own thread
(ThreadingHTTPServer), so a client that holds a keep-alive connection and sends nothing (a process
frozen mid-session, a half-open connection) blocks no other. The upstream server is one request at a
time; here one lock runs each request's handler, after its body is read from the socket and before its
answer is written, so check-then-write (the precondition, then the insert) stays atomic.
"""

from __future__ import annotations

import functools
import http.server
import sys
import threading
from functools import partial
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [
            {
                "domain": "global",
                "reason": "conditionNotMet",
                "message": "At least one of the pre-conditions you specified did not hold.",
                "locationType": "header",
                "location": "If-Match",
            }
        ],
    }
}

_original_insert = objects.insert


def _target_name(request) -> str | None:
    if "name" in request.query:
        return request.query["name"][0]
    upload_type = (request.query.get("uploadType") or [""])[0]
    data = request.data
    if upload_type == "multipart" and isinstance(data, dict):
        return (data.get("meta") or {}).get("name")
    if upload_type == "resumable" and isinstance(data, dict):
        return data.get("name")
    return None


def _precondition_holds(request, storage) -> bool:
    wanted = request.query.get("ifGenerationMatch")
    if not wanted or "upload_id" in request.query:
        return True  # no precondition, or a later chunk of a resumable upload checked at its start
    name = _target_name(request)
    try:
        current = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
    except NotFound:
        current = "0"  # GCS: generation 0 means "no live object"
    return wanted[0] == current


def insert(request, response, storage, *args, **kwargs):
    if (request.query.get("uploadType") or [""])[0] == "media" and request.data is None:
        # An empty media upload (TensorFlow's `dir/` markers from makedirs): GCS stores an empty
        # object; the emulator reads no body as None and crashed on len(None).
        request._data = b""
    if not _precondition_holds(request, storage):
        response.status = HTTPStatus.PRECONDITION_FAILED
        response.json(PRECONDITION_FAILED)
        return None
    return _original_insert(request, response, storage, *args, **kwargs)


_STORE = threading.Lock()  # one handler at a time over the shared store


def _serialized(handler):
    @functools.wraps(handler)
    def run(request, response, storage, *args, **kwargs):
        request.data  # noqa: B018 (read the body now, outside the lock: a client slow to send it blocks no other)
        with _STORE:
            return handler(request, response, storage, *args, **kwargs)

    return run


class ThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # The default listen backlog of 5: gcsfs and TensorFlow open connections in parallel, and dropped
    # SYNs would stall them for a second each.
    request_queue_size = 128


def _serve(self) -> None:
    """APIThread.run with a thread per connection."""
    self._httpd = ThreadingServer((self._host, self._port), partial(server.RequestHandler, self._storage))
    self.is_running.set()
    self._httpd.serve_forever()


def install() -> None:
    """Serve connections concurrently, run handlers one at a time, and route every upload through `insert`
    above (the route table holds direct references)."""
    server.APIThread.run = _serve
    objects.insert = insert
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            handlers[method] = _serialized(insert if handler is _original_insert else handler)
    # The route for uploads POSTed without the /upload prefix calls objects.insert by name.
    objects.insert = _serialized(insert)


if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    install()
    sys.exit(main())
