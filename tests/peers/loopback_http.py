"""A threaded HTTP server on 127.0.0.1 (a free port), the base of the test peers that speak HTTP.

class FakeApi(LoopbackServer):
    def __init__(self):
        super().__init__(_handler(self))     # a BaseHTTPRequestHandler class bound to this peer
with FakeApi() as api: ... api.port ...
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer


class LoopbackServer:
    def __init__(self, handler: type) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
