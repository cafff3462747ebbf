"""deploy/check-secrets.sh run for real (as airflow-init.sh runs it first): every secret of .env.example
refused while empty or `change-me`, named in the message, its value never printed; and the compose
file hands airflow-init every one of them, so the check sees what the operator set.

    .venv/bin/python -m pytest tests/deploy/test_check_secrets.py
"""

from __future__ import annotations

import re
import subprocess

import pytest

from peers.airflow_stack import GENERATED, ROOT, generated_secret, load_compose

SCRIPT = ROOT / "deploy" / "check-secrets.sh"


def secrets_section() -> list[str]:
    """The keys of the "Secrets" section of .env.example, in order."""
    text = (ROOT / ".env.example").read_text()
    section = text.split("# --- Secrets", 1)[1].split("\n# --- ", 1)[0]
    return re.findall(r"^([A-Z][A-Z0-9_]*)=", section, re.M)


def run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30
    )


def good() -> dict[str, str]:
    return {key: generated_secret(key) for key in secrets_section()}


def test_the_script_checks_exactly_the_secrets_of_env_example():
    listed = re.search(r"^SECRETS=\(\n(.*?)\n\)", SCRIPT.read_text(), re.M | re.S).group(1).split()
    assert listed == secrets_section()
    assert set(listed) == set(GENERATED), "the stack harness generates every secret (peers/airflow_stack.py)"
    example = {
        k: v
        for k, v in (
            line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines() if re.match(r"^[A-Z]", line)
        )
    }
    for key in listed:
        assert example[key].startswith("change-me"), f"{key}: .env.example must ship the placeholder"


def test_all_set_passes():
    done = run(good())
    assert done.returncode == 0, done.stderr
    assert "all 9 secrets set" in done.stdout


@pytest.mark.parametrize("key", secrets_section())
@pytest.mark.parametrize("bad", ["change-me", "change-me-too", "", None])
def test_each_placeholder_or_empty_secret_is_refused_by_name(key, bad):
    env = good()
    if bad is None:
        del env[key]
    else:
        env[key] = bad
    done = run(env)
    assert done.returncode == 1, done
    assert f" {key} " in done.stderr and ".env.example" in done.stderr, done.stderr
    for other, value in env.items():  # only the bad one is named, and no value is printed
        if other != key:
            assert other not in done.stderr and value not in done.stderr + done.stdout


def test_every_bad_secret_is_named_at_once():
    done = run({key: "change-me" for key in secrets_section()})
    assert done.returncode == 1
    assert all(key in done.stderr for key in secrets_section()), done.stderr


def test_airflow_init_runs_the_check_first_and_gets_every_secret():
    init = (ROOT / "deploy" / "airflow-init.sh").read_text()
    steps = [line for line in init.splitlines() if line and not line.startswith(("#", "set ", "here="))]
    assert steps[0] == 'bash "$here/check-secrets.sh"', "the check runs before anything touches the database"
    env = load_compose()["services"]["airflow-init"]["environment"]
    text = " ".join(f"{k}={v}" for k, v in env.items())
    for key in secrets_section():
        assert key in env or f"${{{key}:?" in text, f"airflow-init cannot check {key}: compose does not give it"
    # A bad secret stops init before `airflow db migrate` (no airflow on PATH here: it would fail differently).
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "airflow-init.sh")],
        env={"PATH": "/usr/bin:/bin", **good(), "FLOWER_PASSWORD": "change-me"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "FLOWER_PASSWORD" in done.stderr, done
