"""Fixtures for the deployment tests: one real Airflow stack shared by the REST and browser tests.

airflow_stack   session   PostgreSQL + api-server + scheduler + dag-processor + triggerer on
                          loopback (tests/peers/airflow_stack.py), as docker-compose.yaml runs them,
                          with users viewer, user, op of those FAB roles (stack.token_for(name));
                          stopped right after the last test that uses it, not at the session's end
airflow_api     session   REST API v2 client with a JWT (tests/peers/airflow_rest.py)
stack_hub       session   the fake Hub the stack publishes to: its huggingface_default connection
tiny_conf       function  `mlm_pretrain` conf for the tiny preset in a fresh output_root
artifacts_dir   session   where screenshots go: $PYTEST_ARTIFACTS or tests/artifacts/ (gitignored)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import pytest

from peers.airflow_rest import AirflowApi
from peers.airflow_stack import ROOT, data_volume, running_stack
from peers.tiny_data import TINY_FORM

DAG_ID = "mlm_pretrain"
ROLE_USERS = {"viewer": "Viewer", "user": "User", "op": "Op", "trainer": "Trainer"}
# test_stack_e2e.py's run `rest-fault` fails once at step 6, and its retry resumes: a training hook named in the
# environment of the services that run tasks (no run setting can name one); the stack's other runs train as usual.
TRAIN_HOOKS = {"MLM_TRAIN_HOOKS": "mlm_tasks.training.hooks:fail_at_step=6@rest-fault"}
# How the session's stack is stopped early (pytest_runtest_teardown below).
_SHARED_STACK = contextlib.ExitStack()


@pytest.fixture(scope="session")
def stack_hub():
    from peers.fake_hub import FakeHub

    with FakeHub(token=f"hf_stack_{secrets.token_hex(8)}", user="ml-team") as hub:
        yield hub


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory, stack_hub):
    # One user per FAB role besides admin, for the role checks of test_stack_e2e.py. The Hub connection
    # (.env's, so only the services that run tasks get it) points at the fake Hub, for runs that publish;
    # HF_ENDPOINT too, as huggingface_hub checks commit URLs against it.
    connection = json.dumps({"conn_type": "generic", "host": stack_hub.url, "password": stack_hub.token})
    with _SHARED_STACK:
        yield _SHARED_STACK.enter_context(
            running_stack(
                tmp_path_factory.mktemp("stack"),
                users=ROLE_USERS,
                dotenv={"AIRFLOW_CONN_HUGGINGFACE_DEFAULT": connection},
                extra_env={"HF_ENDPOINT": stack_hub.url, **TRAIN_HOOKS},
            )
        )


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop the session's stack after the last test that uses it, in collection order (the order its xdist
    group runs in on one worker, and the order without xdist). Idle, a stack burns about 11 CPU-seconds a
    minute (dag-processor, scheduler, PostgreSQL, triggerer); kept to the session's end on the worker that
    ran its group, it took ~300 CPU-seconds from the other tests of a CI run on two cores."""
    if "airflow_stack" not in item.fixturenames:
        return
    if nextitem is not None and "airflow_stack" in nextitem.fixturenames:
        return
    items = item.session.items
    if not any("airflow_stack" in later.fixturenames for later in items[items.index(item) + 1 :]):
        _SHARED_STACK.close()  # the stack's own exit checks: no process or port left behind


@pytest.fixture(scope="session")
def airflow_api(airflow_stack) -> AirflowApi:
    api = AirflowApi(airflow_stack.url, airflow_stack.token)
    errors = api.get("/importErrors")["import_errors"]
    assert not errors, f"DAG import errors: {errors}"
    dag = api.unpause(DAG_ID)
    assert dag["is_paused"] is False
    return api


@pytest.fixture
def tiny_conf(airflow_stack, tmp_path) -> dict:
    # The flat params override the config file, so the tiny values are passed explicitly.
    out = data_volume(airflow_stack) / tmp_path.name
    return {
        **TINY_FORM,
        "output_root": str(out),
    }


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    path = Path(os.environ.get("PYTEST_ARTIFACTS") or ROOT / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
