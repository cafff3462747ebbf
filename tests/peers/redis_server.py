"""A real redis-server (Debian's `redis-server` package) on loopback, as the compose `redis` service runs it.

    redis = RedisServer(procs, workdir, password)   # procs: peers.airflow_stack.Procs
    redis.start(); redis.url                         # redis://:<password>@127.0.0.1:<port>/0
    redis.stop(); redis.start()                      # same port, same data: an outage and a return

The command line is the compose service's (`--appendonly yes --requirepass ...`, so queued tasks
survive a restart) plus what loopback needs: a free port, bound to 127.0.0.1, data in `workdir`.
"""
from __future__ import annotations

import shutil
import signal
import socket
import time
from pathlib import Path


def redis_server_bin() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise RuntimeError("redis-server not found: apt-get install -y redis-server (.ci/run installs it)")
    return found


class RedisServer:
    NAME = "redis"

    def __init__(self, procs, workdir: Path, password: str, port: int | None = None):
        from peers.airflow_stack import free_port

        self.procs, self.dir, self.password = procs, workdir, password
        self.port = port or free_port()
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def argv(self, compose_command: list[str]) -> list[str]:
        """The compose service's command with the loopback differences appended (later flags win)."""
        return [redis_server_bin(), *compose_command[1:], "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--daemonize", "no"]

    def start(self, compose_command: list[str], timeout: float = 30) -> None:
        self.procs.start(self.NAME, self.argv(compose_command), {"PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + timeout
        while not self.ping():
            self.procs.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer PING:\n{self.procs.tail(self.NAME)}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM: Redis flushes its append-only file and exits, as `docker compose stop redis` does."""
        from peers.airflow_stack import stop_group

        stop_group(self.procs.running.pop(self.NAME), timeout=30, sig=signal.SIGTERM)

    def ping(self) -> bool:
        """RESP by hand (AUTH, PING): no client library between the test and the server."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                reply = b""
                while reply.count(b"\r\n") < 2:
                    chunk = sock.recv(256)
                    if not chunk:
                        break
                    reply += chunk
                return reply == b"+OK\r\n+PONG\r\n"
        except OSError:
            return False
