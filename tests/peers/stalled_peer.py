"""A loopback peer that accepts connections and never answers: a storage service (or a network path)
gone silent, a connection left half-open.

    with StalledPeer() as peer:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", peer.endpoint)   # every gs:// request now hangs
        ... peer.connections ...                                      # how many clients got through connect
"""

from __future__ import annotations

import socket
import threading


class StalledPeer:
    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def connections(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the accept timeout, or the listener closed
                continue
            self._held.append(conn)  # held open, never read from, never written to

    def __enter__(self) -> StalledPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._listener.close()
