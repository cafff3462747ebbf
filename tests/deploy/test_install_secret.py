"""deploy/install-secret.sh run for real as root against a temporary auth folder (no Docker here): the
key it installs is readable by the Airflow user, uid 50000, where the file `docker compose cp` leaves
(root, 0600) is not.

    .venv/bin/python -m pytest tests/deploy/test_install_secret.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from peers.airflow_stack import ROOT

SCRIPT = ROOT / "deploy" / "install-secret.sh"
AIRFLOW_UID = 50000
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sets file owners: run as root (CI and the dev box are)")


@pytest.fixture
def auth_dir():
    """The airflow-auth volume as the image makes it: /opt/airflow/auth owned by airflow:0. Under /tmp,
    not pytest's root-only tmp_path, so uid 50000 can reach it."""
    path = Path(tempfile.mkdtemp(prefix="airflow-auth-", dir="/tmp"))
    os.chown(path, AIRFLOW_UID, 0)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _install(auth_dir: Path, name: str, data: str, user: int | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "MLM_AUTH_DIR": str(auth_dir)}
    return subprocess.run(
        ["bash", str(SCRIPT), name], input=data, env=env, capture_output=True, text=True, timeout=30, user=user
    )


def _read_as_airflow(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["cat", str(path)], capture_output=True, text=True, timeout=30, user=AIRFLOW_UID)


def test_copied_key_is_unreadable_and_installed_key_is_readable_by_airflow(auth_dir):
    copied = auth_dir / "copied_key"  # what `docker compose cp ~/.ssh/tpu ...` leaves: root, 0600
    copied.write_text(KEY)
    copied.chmod(0o600)
    assert _read_as_airflow(copied).returncode != 0

    done = _install(auth_dir, "tpu_ssh_key", KEY)
    assert done.returncode == 0, done.stderr
    key = auth_dir / "tpu_ssh_key"
    info = key.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (AIRFLOW_UID, 0, 0o400)
    assert _read_as_airflow(key).stdout == KEY
    # A rerun (a new key) replaces the read-only file and leaves no temporary behind.
    assert _install(auth_dir, "tpu_ssh_key", KEY + "#2\n").returncode == 0
    assert _read_as_airflow(key).stdout == KEY + "#2\n"
    assert sorted(p.name for p in auth_dir.iterdir()) == ["copied_key", "tpu_ssh_key"]


@pytest.mark.parametrize(
    "name, data, user, message",
    [
        ("../escape", KEY, None, "plain file name"),
        ("gcp-sa.json", "", None, "stdin was empty"),
        ("tpu_ssh_key", KEY, AIRFLOW_UID, "run as root"),
    ],
)
def test_refuses_what_would_install_nothing_useful(auth_dir, name, data, user, message):
    done = _install(auth_dir, name, data, user=user)
    assert done.returncode != 0 and message in done.stderr
    assert list(auth_dir.iterdir()) == []


def test_readme_and_env_example_install_keys_with_this_script():
    """The manual (docs/operations.md, "Bring up Airflow") installs the key with this script, and no page
    of README.md or docs/ copies one in with `docker compose cp`."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert (
        "docker compose exec -T -u 0 airflow-scheduler bash /opt/airflow/deploy/install-secret.sh tpu_ssh_key"
        in operations
    )
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert not re.search(r"docker compose cp \S+ \S+:/opt/airflow/auth/", page.read_text()), (
            f"{page.name}: that file is root's, 0600"
        )
    example = (ROOT / ".env.example").read_text()
    assert '"key_file": "/opt/airflow/auth/tpu_ssh_key"' in example and "no_host_key_check" not in example
