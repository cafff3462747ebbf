"""A person approves the release (`publish.require_approval`) on the real stack: Airflow's approval
task between gate and publish, answered through the REST API's human-in-the-loop endpoints, and its
form seen once in a real browser.

    .venv/bin/python -m pytest tests/deploy/test_approval.py

Three tiny runs are triggered at once, each in its own output_root, all asking for approval before
publishing to the fake Hub (the stack's huggingface_default connection, conftest.py), since the
stack's deployment file (deploy/deployment.yaml) pins publish.require_approval and names the admin
as the one approver:
  approve  the form shows the review page (screenshot approval_form.png); approved with
           PATCH .../taskInstances/approve_release/-1/hitlDetails → publish commits the model to the Hub;
  reject   a User (who may answer HITL tasks in FAB, but is no approver) is refused; rejected with a
           comment → publish is skipped, the comment is in approve_release's log, nothing is committed,
           and the run still succeeds (summary runs);
  bypass   a User marks approve_release success instead of answering it → publish refuses: no
           recorded approval, nothing committed.
A timeout (the scheduler answers the default, Reject) is tested without a stack in
tests/plugins/test_release_approval.py.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from peers.airflow_stack import ADMIN_USER, data_volume
from peers.tiny_data import TINY_FORM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = "mlm_pretrain"
TASK = "approve_release"
RUN_TIMEOUT_S = 1200
REPOS = {
    "approve": "ml-team/roberta-approved",
    "reject": "ml-team/roberta-rejected",
    "bypass": "ml-team/roberta-bypassed",
}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def runs(airflow_stack, airflow_api, tiny_prepared) -> dict[str, str]:
    """The runs triggered up front, so their training overlaps: {name: run_id}. Each output_root holds the tiny
    shard set already (plan_shards finds it complete): these runs are about the release, not the data."""
    prepared = Path(tiny_prepared[0].output_root) / "datasets"
    out = {}  # approval: the deployment asks for it (a run may not set it)
    for name, repo in REPOS.items():
        output_root = data_volume(airflow_stack) / f"out-approval-{name}"
        shutil.copytree(prepared, output_root / "datasets")
        conf = {
            **TINY_FORM,
            "output_root": str(output_root),
            "overrides": {"publish.enabled": True, "publish.repo_id": repo},
        }
        run = airflow_api.trigger(DAG_ID, conf=conf, run_id=f"approval-{name}")
        assert run["state"] == "queued", run
        out[name] = run["dag_run_id"]
    return out


def _hitl_path(run_id: str) -> str:
    return f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/{TASK}/-1/hitlDetails"


def _awaiting(api, run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    """The approval request, once the task waits for an answer (state awaiting_input)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ti = api.task_instance(DAG_ID, run_id, TASK)
        if ti["state"] == "awaiting_input":
            return api.get(_hitl_path(run_id))
        run = api.run(DAG_ID, run_id)
        assert run["state"] not in ("success", "failed") and ti["state"] not in ("skipped", "failed"), (
            f"{TASK} never waited for an answer:\n" + api.explain(DAG_ID, run_id)
        )
        time.sleep(3)
    raise AssertionError(f"{TASK} not awaiting input after {timeout}s:\n" + api.explain(DAG_ID, run_id))


def _answer(api, run_id: str, option: str, comment: str) -> dict:
    reply = api.client.patch(
        _hitl_path(run_id), json={"chosen_options": [option], "params_input": {"comment": comment}}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def _states(api, run_id: str) -> dict[str, str]:
    return {ti["task_id"]: ti["state"] for ti in api.task_instances(DAG_ID, run_id)}


def _check_request(request: dict, repo: str) -> None:
    assert request["options"] == ["Approve", "Reject"] and request["defaults"] == ["Reject"]
    assert not request["response_received"] and set(request["params"]) == {"comment"}
    body = request["body"]
    assert f"pushed to `{repo}`" in body and repo in request["subject"]
    for section in (
        "### Evaluation",
        "untrained model",
        "unigram baseline",
        "last published",
        "### Gate: passed",
        "### Last published model",
        "### Validation loss during training",
        "### Downstream tasks",
    ):
        assert section in body, (section, body)


def test_the_form_in_the_browser(airflow_stack, airflow_api, runs, artifacts_dir):
    """The approval form as a reviewer sees it ("Required actions" of the task), with the review page."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: apt-get install -y chromium"
    run_id = runs["approve"]
    request = _awaiting(airflow_api, run_id)
    _check_request(request, REPOS["approve"])
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        page.goto(f"{airflow_stack.url}/dags/{DAG_ID}/runs/{run_id}/tasks/{TASK}/required_actions")
        page.get_by_label("Username").fill(ADMIN_USER)
        page.get_by_label("Password").fill(airflow_stack.password)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_text("Validation loss during training").first.wait_for()
        page.get_by_role("button", name="Approve").first.wait_for()
        text = page.inner_text("body")
        shot = artifacts_dir / "approval_form.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    print(f"approval form screenshot: {shot}")
    for expected in (REPOS["approve"], "Gate: passed", "masked-token accuracy", "Reject", "Comment"):
        assert expected in text, (expected, text[:3000])


def test_approved_through_rest_publishes(airflow_api, runs, stack_hub):
    run_id = runs["approve"]
    _check_request(_awaiting(airflow_api, run_id), REPOS["approve"])
    answer = _answer(airflow_api, run_id, "Approve", "numbers look right")
    assert answer["chosen_options"] == ["Approve"] and answer["responded_by"]["name"] == ADMIN_USER

    done = airflow_api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
    assert done["state"] == "success", airflow_api.explain(DAG_ID, run_id)
    states = _states(airflow_api, run_id)
    assert states[TASK] == states["publish"] == states["summary"] == "success", states
    assert len(stack_hub.commits_to(REPOS["approve"])) == 1
    log = airflow_api.log(DAG_ID, run_id, TASK, 1)
    assert f"Approved by {ADMIN_USER} (numbers look right): publish runs." in log, log[-3000:]
    assert f"Release approved by {ADMIN_USER} (id 1)." in airflow_api.log(DAG_ID, run_id, "publish", 1)


def test_rejected_through_rest_skips_publish_with_the_reason(airflow_stack, airflow_api, runs, stack_hub):
    run_id = runs["reject"]
    _check_request(_awaiting(airflow_api, run_id), REPOS["reject"])
    # A Viewer sees the request but may not answer it; nor may a User, who is no approver.
    for role in ("viewer", "user"):
        client = _client(airflow_stack, role)
        assert client.get(_hitl_path(run_id)).status_code == 200
        refused = client.patch(_hitl_path(run_id), json={"chosen_options": ["Approve"]})
        assert refused.status_code == 403, (role, refused.text)
    _answer(airflow_api, run_id, "Reject", "val loss still falling, train longer")
    # A second answer is refused: the decision is made once.
    again = airflow_api.client.patch(_hitl_path(run_id), json={"chosen_options": ["Approve"]})
    assert again.status_code == 409, again.text

    done = airflow_api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
    assert done["state"] == "success", airflow_api.explain(DAG_ID, run_id)  # a rejection is no failure
    states = _states(airflow_api, run_id)
    assert states[TASK] == "success" and states["publish"] == "skipped" and states["summary"] == "success", states
    assert not stack_hub.commits_to(REPOS["reject"])
    log = airflow_api.log(DAG_ID, run_id, TASK, 1)
    assert f"Rejected by {ADMIN_USER}: val loss still falling, train longer. publish is skipped." in log, log[-3000:]


def _client(airflow_stack, user: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{airflow_stack.url}/api/v2",
        timeout=60,
        headers={"Authorization": f"Bearer {airflow_stack.token_for(user)}"},
    )


def test_a_task_marked_success_is_no_approval(airflow_stack, airflow_api, runs, stack_hub):
    run_id = runs["bypass"]
    _awaiting(airflow_api, run_id)
    ti_path = f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/{TASK}"
    marked = _client(airflow_stack, "user").patch(ti_path, json={"new_state": "success"})
    assert marked.status_code == 200, marked.text  # FAB's User may mark task instances

    done = airflow_api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
    states = _states(airflow_api, run_id)
    assert done["state"] == "failed" and states[TASK] == "success" and states["publish"] == "failed", states
    assert not stack_hub.commits_to(REPOS["bypass"])
    log = airflow_api.log(DAG_ID, run_id, "publish", 1)
    assert "approve_release recorded no answer for this run" in log, log[-3000:]
