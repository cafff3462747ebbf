"""A real OpenSSH server on 127.0.0.1 for tests: the stand-in for the shell of a TPU VM worker.

    with running_sshd(tmp_dir) as server:      # or the `sshd` fixture in tests/conftest.py
        host, port, user, key_path = server
        airflow_conn_uri(server)               # ssh://user@127.0.0.1:port?key_file=...
        host_public_key(server)                # ("ssh-ed25519", "AAAA..."): what its "node" publishes

Runs `/usr/sbin/sshd -D -e -f <cfg>` (Debian: apt-get install openssh-server) on a free port with a
generated host key and a generated client key in authorized_keys. Like a TPU VM's stock sshd it
accepts only LANG and LC_* from the client's environment. With `tpu.python` pointing at the
simulated image (tests/peers/tpu_vm_image.py) its "worker" runs the image's Python and TensorFlow. As root it logs
in as root; as
any other user sshd runs without privilege separation and only that user can log in.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


class SshServer(NamedTuple):
    host: str
    port: int
    user: str
    key_path: str


def airflow_conn_uri(server: SshServer, no_host_key_check: bool = True) -> str:
    """An Airflow connection URI (e.g. for AIRFLOW_CONN_TPU_SSH) that logs in to `server`. With
    no_host_key_check=False it is the connection docs/google-cloud.md describes (user + key): the login then pins
    the host key the fake TPU API publishes (`host_public_key`)."""
    uri = f"ssh://{quote(server.user)}@{server.host}:{server.port}?key_file={quote(server.key_path, safe='')}"
    return uri + ("&no_host_key_check=true" if no_host_key_check else "")


def host_public_key(server: SshServer) -> tuple[str, str]:
    """(type, base64) of the server's host key, as a TPU VM's guest agent publishes it in hostkeys/."""
    key_type, blob = (Path(server.key_path).parent / "host_key.pub").read_text().split()[:2]
    return key_type, blob


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            if s.recv(4).startswith(b"SSH-"):
                return
        time.sleep(0.1)
    raise RuntimeError(f"sshd did not answer on port {port} within {timeout}s: {log.read_text()}")


@contextlib.contextmanager
def running_sshd(work_dir: Path) -> Iterator[SshServer]:
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd is missing: apt-get install -y openssh-server")
    work_dir.mkdir(parents=True, exist_ok=True)
    host_key, client_key = work_dir / "host_key", work_dir / "client_key"
    _keygen(host_key)
    _keygen(client_key)
    authorized = work_dir / "authorized_keys"
    authorized.write_text((work_dir / "client_key.pub").read_text())
    authorized.chmod(0o600)
    user = getpass.getuser()
    port = _free_port()
    config = work_dir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress 127.0.0.1:{port}",
                f"HostKey {host_key}",
                f"PidFile {work_dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {user}",
                "StrictModes no",
                "UsePAM no",
                "PrintMotd no",
                "LogLevel VERBOSE",
                "MaxSessions 50",
                "MaxStartups 50:30:100",
                # As Ubuntu's (and so a TPU VM's) sshd_config (the Hub token does not use it: it goes on stdin).
                "AcceptEnv LANG LC_*",
                # bash sources ~/.bashrc for a command sshd runs only as a top-level shell (SHLVL < 2). Ubuntu's
                # .bashrc (a TPU VM's) returns at once when not interactive; this machine's root .bashrc runs
                # `pyenv init`, whose rehash takes a lock file that a session killed mid-rehash leaves behind,
                # and every later login then waits 60 s and prints to the step's output (CI failed on it).
                "SetEnv SHLVL=1",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
    log = work_dir / "sshd.log"
    with open(log, "wb") as log_file:
        # sshd must be started by absolute path (it re-executes itself).
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log_file, stderr=log_file)
    try:
        _wait_for_banner(port, proc, log)
        yield SshServer("127.0.0.1", port, user, str(client_key))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


try:
    import pytest
except ImportError:
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def sshd(tmp_path_factory):
        """(host, port, user, private_key_path) of a real sshd on loopback, for the whole session."""
        with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
            yield server
