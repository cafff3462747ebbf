"""deploy/redis-server.sh run for real (Debian's redis-server on loopback, started with the compose
`redis` service's command and environment): the password works, a wrong one and none are refused,
the append-only file is on, and the password is on no command line and in no environment of the
server, nor in plain text in the ACL file it reads.

    .venv/bin/python -m pytest tests/deploy/test_redis_server.py
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from peers.airflow_stack import ROOT, Procs, load_compose, path_map, translate
from peers.redis_server import RedisServer


@pytest.fixture
def redis(tmp_path):
    compose = load_compose()["services"]["redis"]
    command = [translate(arg, path_map(compose, tmp_path)) for arg in compose["command"]]  # → deploy/redis-server.sh
    procs = Procs(marker=secrets.token_hex(8), logs=tmp_path)
    server = RedisServer(procs, tmp_path / "redis", secrets.token_hex(24))
    server.start(command)
    try:
        yield server
    finally:
        procs.stop_all()


def test_compose_runs_the_script_and_keeps_the_password_out_of_argv():
    service = load_compose()["services"]["redis"]
    assert service["command"] == ["bash", "/opt/mlm/redis-server.sh"]
    assert "./deploy/redis-server.sh:/opt/mlm/redis-server.sh:ro" in service["volumes"]
    assert "REDIS_PASSWORD" not in " ".join(service["command"])
    health = " ".join(service["healthcheck"]["test"])
    assert "REDISCLI_AUTH=" in health and " -a " not in health


def test_password_required_and_appendonly_on(redis):
    assert redis.ask(f"AUTH {redis.password}", "PING").startswith(b"+OK\r\n+PONG\r\n")
    assert redis.ask("AUTH wrong-password").startswith(b"-WRONGPASS")
    assert redis.ask("PING").startswith(b"-NOAUTH")
    assert "appendonly yes" in (redis.dir / "run" / "redis.conf").read_text()
    assert redis.ask(f"AUTH {redis.password}", "SET probe 1").startswith(b"+OK\r\n+OK")
    assert any(p.name.startswith("appendonly") for p in redis.dir.rglob("*"))  # the append-only file is written


@pytest.mark.parametrize(
    "command",
    [
        "CONFIG SET dir /tmp",
        "FLUSHALL",
        "KEYS *",
        "ACL LIST",
        "BGSAVE",
        'EVAL "return 1" 0',
        "SHUTDOWN NOSAVE",
        "MONITOR",
    ],
)
def test_the_one_user_may_not_reconfigure_flush_or_script_the_server(redis, command):
    """The Celery broker's user (every worker, so every task's code, holds its password) gets the data
    commands only."""
    answer = redis.ask(f"AUTH {redis.password}", command)
    assert answer.startswith(b"+OK\r\n-NOPERM"), answer


def test_kombus_lock_works_and_a_loaded_script_gets_no_more_than_its_caller(redis):
    """Celery's Redis transport restores unacked messages under kombu's lock, a Lua script that redis-py
    registers (SCRIPT LOAD) and runs (EVALSHA): the ACL must let that through, or every worker dies at
    its first poll. A script runs under its caller's ACL, so one that calls FLUSHALL is still refused."""
    import redis as redis_py
    from kombu.transport.redis import Mutex

    client = redis_py.Redis.from_url(redis.url)
    client.set("probe", "1")
    with Mutex(client, "unacked_mutex", expire=5):
        assert client.get("unacked_mutex") is not None  # held
    assert client.get("unacked_mutex") is None  # released by the Lua script
    flush = client.register_script("return redis.call('FLUSHALL')")
    with pytest.raises(redis_py.exceptions.ResponseError, match="can.t run this command"):
        flush()
    assert client.get("probe") == b"1"


def test_password_is_in_no_argv_environment_or_file(redis):
    pid = redis.procs.running["redis"].pid  # exec'd: the script's pid is redis-server's
    secret = redis.password.encode()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"redis-server" in cmdline and secret not in cmdline
    assert secret not in Path(f"/proc/{pid}/environ").read_bytes()
    run = redis.dir / "run"
    for path in run.iterdir():
        assert secret not in path.read_bytes(), path
        assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
    assert (run / "users.acl").read_text().startswith("user default on #")


def test_refuses_an_empty_password(tmp_path):
    script = ROOT / "deploy" / "redis-server.sh"
    done = subprocess.run(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": "", "MLM_REDIS_RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "REDIS_PASSWORD" in done.stderr
