"""The web UI in a real browser (Debian's chromium, headless, driven by Playwright) on the real stack:
log in, open the trigger form of mlm_pretrain, see every param with its title and description,
change them to the tiny preset (steps=8), trigger, and see the run reach success in the grid (each task's
state there as the API reports it).

    .venv/bin/python -m pytest tests/deploy/test_browser.py

Screenshots of the form and the grid go to $PYTEST_ARTIFACTS or tests/artifacts/.
Needs `apt-get install chromium` and `pip install playwright` (its bundled browser download is not
used: Playwright drives the system chromium through executable_path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from mlm_tasks.paths import safe_run_id
from peers.airflow_stack import ADMIN_USER, ROOT, data_volume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAG_ID = "mlm_pretrain"
RUN_ID = "ui-steps8"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def page(airflow_stack):
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: apt-get install -y chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 2000})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def _param_texts(airflow_api) -> dict[str, tuple[str, str]]:
    """name → (title, description) as the DAG declares them, read back from the REST API."""
    params = airflow_api.get(f"/dags/{DAG_ID}/details")["params"]
    out = {}
    for name, param in params.items():
        schema = param.get("schema", {})
        out[name] = (schema["title"], param.get("description") or schema["description"])
    return out


def test_trigger_form_to_successful_run_in_grid(page, airflow_stack, airflow_api, artifacts_dir, tmp_path):
    # Log in: the UI sends an anonymous visitor to the FAB auth manager's login page (/auth/login/).
    page.goto(f"{airflow_stack.url}/dags/{DAG_ID}")
    page.get_by_label("Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(airflow_stack.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**/dags/{DAG_ID}")

    # The trigger form shows every param with its title and description.
    page.get_by_test_id("trigger-dag-button").click()
    form = page.get_by_role("dialog")
    form.get_by_text("Run Parameters").wait_for()
    text = form.inner_text()
    expected = _param_texts(airflow_api)
    assert {"config_file", "output_root", "steps", "overrides"} <= set(expected)
    for name, (title, description) in expected.items():
        assert title in text and description in text, f"{name}: {title!r} / {description!r} not in the form"

    # The tiny preset: the flat fields override the file, so each one is set; steps is the change.
    output_root = data_volume(airflow_stack) / "out-browser"  # where the deployment lets runs write
    values = {
        "config_file": str(ROOT / "configs" / "tiny.yaml"),
        "output_root": str(output_root),
        "vocab_size": "1000",
        "max_length": "64",
        "steps": "8",
        "batch_size": "8",
    }
    for name, value in values.items():
        form.locator(f'input[name="element_{name}"]').fill(value)
    form.screenshot(path=str(artifacts_dir / "trigger_form.png"))
    form.get_by_text("Advanced Options").click()
    form.locator('input[name="dagRunId"]').fill(RUN_ID)
    form.screenshot(path=str(artifacts_dir / "trigger_form_advanced.png"))
    form.get_by_role("button", name="Trigger").click()
    page.wait_for_url(f"**/dags/{DAG_ID}/runs/{RUN_ID}")
    page.goto("about:blank")  # the open grid polls the API and re-renders all run long: CPU the run needs

    run = airflow_api.wait_for_run(DAG_ID, RUN_ID, timeout=1200)
    assert run["state"] == "success", airflow_api.explain(DAG_ID, RUN_ID)
    assert run["conf"]["steps"] == 8 and run["conf"]["output_root"] == str(output_root), run["conf"]

    # The grid shows the run and each of its tasks as successful.
    page.goto(f"{airflow_stack.url}/dags/{DAG_ID}/runs/{RUN_ID}")
    header = page.get_by_test_id("state-badge").first
    header.wait_for()
    assert header.inner_text().strip() == "Success"
    states = {
        ti["task_id"]: ti["state"]
        for ti in airflow_api.get(f"/dags/{DAG_ID}/dagRuns/{RUN_ID}/taskInstances")["task_instances"]
    }
    assert states["train"] == states["evaluate"] == states["summary"] == "success", states
    # plan_shards, write_shards and merge_shards sit in the shard_set task group, collapsed by default.
    expand = page.get_by_test_id("expand-all-button").first
    expand.wait_for()
    if expand.is_enabled():
        expand.click()
    for task_id, state in states.items():  # e.g. publishing is skipped when the gate says no
        tooltip = _hover_tooltip(page, page.get_by_test_id(f"grid-{RUN_ID}-{task_id}"), task_id)
        assert f"State: {state.replace('_', ' ').title()}" in tooltip.inner_text(), tooltip.inner_text()
        page.mouse.move(0, 0)  # close it: an open tooltip covers the next cell
        tooltip.wait_for(state="hidden")
    page.screenshot(path=str(artifacts_dir / "grid_success.png"))

    summary = json.loads((output_root / "runs" / safe_run_id(RUN_ID) / "train" / "summary.json").read_text())
    assert summary["steps"] == 8, summary


def _hover_tooltip(page, cell, task_id: str):
    """The grid cell's tooltip. The grid re-renders as it polls the API, and a re-render under the pointer can
    swallow the hover (on a loaded machine the first one never showed in 60 s): hover again until it shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    tooltip = page.get_by_role("tooltip").filter(has_text=f"Task ID: {task_id}")
    for _ in range(6):
        cell.hover()
        try:
            tooltip.wait_for(timeout=10_000)
            return tooltip
        except PlaywrightTimeout:
            page.mouse.move(0, 0)
    raise AssertionError(f"no tooltip for {task_id} after 6 hovers of 10 s")
