"""Flower as the compose `airflow-flower` service runs it (`airflow celery flower` with that service's
environment, against a real redis-server started by the `redis` service's script): it refuses a
visitor without the login or with a wrong one, lets `flower:FLOWER_PASSWORD` in, and the password is
on no command line of its process.

    .venv/bin/python -m pytest tests/deploy/test_flower.py
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest

from peers.airflow_stack import FLOWER, Procs, free_port, stack_spec
from peers.redis_server import RedisServer

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture
def flower(tmp_path):
    spec = stack_spec(tmp_path / "home", free_port(), free_port(), variables={"MLM_EXECUTOR": "CeleryExecutor"})
    (tmp_path / "home").mkdir()
    procs = Procs(marker=secrets.token_hex(8), logs=tmp_path)
    port = free_port()
    # The loopback differences: listen on 127.0.0.1 (compose publishes 127.0.0.1:5555 of the host) on a free port.
    env = {**spec.envs[FLOWER], "AIRFLOW__CELERY__FLOWER_HOST": "127.0.0.1", "AIRFLOW__CELERY__FLOWER_PORT": str(port)}
    try:
        RedisServer(procs, tmp_path / "redis", spec.envs["redis"]["REDIS_PASSWORD"], port=spec.redis_port).start(
            spec.commands["redis"]
        )
        proc = procs.start(FLOWER, spec.commands[FLOWER], env, cwd=spec.home)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            procs.check_alive()
            try:
                httpx.get(url, timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Flower did not answer:\n{procs.tail(FLOWER)}") from None
                time.sleep(1)
        yield url, spec.dotenv["FLOWER_PASSWORD"], proc.pid
    finally:
        procs.stop_all()


def test_flower_asks_for_its_login_and_keeps_the_password_off_argv(flower):
    url, password, pid = flower
    assert httpx.get(f"{url}/workers", timeout=30).status_code == 401
    assert httpx.get(f"{url}/api/workers", timeout=30).status_code == 401  # the API that can shut workers down
    assert httpx.get(f"{url}/workers", auth=("flower", "wrong"), timeout=30).status_code == 401
    assert httpx.get(f"{url}/workers", auth=("flower", password), timeout=30).status_code == 200
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"flower" in cmdline and password.encode() not in cmdline, cmdline
