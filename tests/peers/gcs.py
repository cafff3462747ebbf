"""A real GCS JSON API on loopback for tests: gcp-storage-emulator, started once per session.

Fixtures (exported by tests/conftest.py):
    gcs       session: starts the emulator on a free port, points STORAGE_EMULATOR_HOST at it,
              creates a bucket; `gcs.bucket`, `gcs.endpoint`, `gcs.client()`.
    gcs_root  function: a fresh `gs://<bucket>/<unique prefix>` for one test.

google-cloud-storage, gcsfs (token="anon", see mlm_tasks.storage) and gcloud-aio-storage (the
Airflow provider's async hook) all honour STORAGE_EMULATOR_HOST. TensorFlow's own gs:// client does
not: see tls_proxy.py. Run the emulator by hand for debugging with
    python tests/peers/gcs_emulator.py start --host 127.0.0.1 --port 9023 --in-memory
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).with_name("gcs_emulator.py")
BUCKET = "mlm-test"
PROJECT = "mlm-test-project"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class GcsEmulator:
    host: str
    port: int
    bucket: str
    project: str
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self):
        """A google-cloud-storage client talking to the emulator."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=self.project, credentials=AnonymousCredentials(), client_options={"api_endpoint": self.endpoint}
        )

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", *[p.strip("/") for p in parts]])


def _wait_until_up(proc: subprocess.Popen, endpoint: str, log_path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"GCS emulator exited with {proc.returncode}; log: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"GCS emulator did not answer on {endpoint} within {timeout_s}s; log: {log_path}")


def start_emulator(log_dir: Path) -> tuple[subprocess.Popen, GcsEmulator]:
    port = free_port()
    log_path = log_dir / "gcs-emulator.log"
    cmd = [
        sys.executable,
        str(LAUNCHER),
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--in-memory",
        "--default-bucket",
        BUCKET,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=log_dir)
    emu = GcsEmulator("127.0.0.1", port, BUCKET, PROJECT, log_path)
    try:
        _wait_until_up(proc, emu.endpoint, log_path)
    except BaseException:
        stop(proc)
        raise
    return proc, emu


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    proc, emu = start_emulator(tmp_path_factory.mktemp("gcs"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", emu.endpoint)
        # gcsfs' HNS probe stalls ~60 s a call against anything but the real service.
        mp.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        try:
            yield emu
        finally:
            stop(proc)


@pytest.fixture
def gcs_root(gcs, request) -> str:
    """A fresh gs:// prefix per test, so tests share one emulator without seeing each other."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:40]
    return gcs.uri(f"t-{uuid.uuid4().hex[:8]}-{name}")
