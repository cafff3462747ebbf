"""A real redis-server (Debian's `redis-server` package) on loopback, as the compose `redis` service runs it.

    redis = RedisServer(procs, workdir, password)   # procs: peers.airflow_stack.Procs
    redis.start(compose_command); redis.url         # redis://:<password>@127.0.0.1:<port>/0
    redis.stop(); redis.start(compose_command)      # same port, same data: an outage and a return

The command is the compose service's (deploy/redis-server.sh: the password's hash in an ACL file,
the append-only file on, so queued tasks survive a restart) with REDIS_PASSWORD in its environment as
compose gives it, plus what loopback needs after it: a free port, bound to 127.0.0.1, data and the
ACL file in `workdir`.
"""

from __future__ import annotations

import shutil
import signal
import socket
import time
from pathlib import Path


def redis_server_bin() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
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
        """The compose service's command with the loopback differences appended (the script hands them
        to redis-server after its config file, so they win)."""
        return [
            *compose_command,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
        ]

    def env(self) -> dict[str, str]:
        """The compose service's environment (REDIS_PASSWORD), redis-server on PATH, the ACL file in workdir."""
        bin_dir = str(Path(redis_server_bin()).parent)
        return {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "REDIS_PASSWORD": self.password,
            "MLM_REDIS_RUN_DIR": str(self.dir / "run"),
        }

    def start(self, compose_command: list[str], timeout: float = 30) -> None:
        self.procs.start(self.NAME, self.argv(compose_command), self.env())
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

    def ask(self, *commands: str, timeout: float = 5) -> bytes:
        """Inline commands on one connection (e.g. "AUTH pw", "CONFIG GET appendonly"), then QUIT, which
        makes the server close it: the raw RESP replies, QUIT's +OK last."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall("".join(f"{c}\r\n" for c in (*commands, "QUIT")).encode())
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        return reply

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
