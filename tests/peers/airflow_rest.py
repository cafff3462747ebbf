"""Small client for Airflow's public REST API v2, as an operator's script would use it.

api = AirflowApi(stack.url, stack.token)
run = api.trigger("mlm_pretrain", conf={...}, run_id="e2e-1")
run = api.wait_for_run("mlm_pretrain", run["dag_run_id"], timeout=900)
assert run["state"] == "success", api.explain("mlm_pretrain", run["dag_run_id"])
"""

from __future__ import annotations

import time
from urllib.parse import quote

import httpx

FINISHED = ("success", "failed")


class AirflowApi:
    def __init__(self, url: str, token: str):
        self.client = httpx.Client(base_url=f"{url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def _ok(self, reply: httpx.Response) -> dict:
        assert reply.status_code < 300, (
            f"{reply.request.method} {reply.request.url} → {reply.status_code}: {reply.text}"
        )
        return reply.json()

    def get(self, path: str, **params) -> dict:
        return self._ok(self.client.get(path, params=params))

    def unpause(self, dag_id: str) -> dict:
        return self._ok(self.client.patch(f"/dags/{dag_id}", json={"is_paused": False}))

    def trigger(self, dag_id: str, *, conf: dict, run_id: str) -> dict:
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        return self._ok(self.client.post(f"/dags/{dag_id}/dagRuns", json=body))

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float, poll: float = 3) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if run["state"] in FINISHED or time.monotonic() > deadline:
                return run
            time.sleep(poll)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}")

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> list[dict]:
        mapped = "" if map_index is None else f"/{map_index}"
        reply = self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}{mapped}/tries")
        return reply["task_instances"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of the run (mapped ones one per map index), with state, hostname, queue."""
        return self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances", limit=1000)["task_instances"]

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        reply = self.client.get(
            f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": True},
        )
        return "\n".join(_log_line(line) for line in self._ok(reply)["content"])

    def explain(self, dag_id: str, run_id: str) -> str:
        """Task states and the log tail of every task that did not succeed: for assertion messages."""
        tis = self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")["task_instances"]
        lines = [f"{ti['task_id']}: {ti['state']} (try {ti['try_number']})" for ti in tis]
        for ti in tis:
            if ti["state"] not in ("success", "skipped", None) and ti["try_number"]:
                log = self.log(dag_id, run_id, ti["task_id"], ti["try_number"])
                lines.append(f"--- log of {ti['task_id']} try {ti['try_number']}:\n{log[-4000:]}")
        return "\n".join(lines)


def _log_line(line) -> str:
    """A structured log line ({"event", "error_detail", ...}) as text, with the exception if any."""
    if not isinstance(line, dict):
        return str(line)
    text = str(line.get("event", line))
    for error in line.get("error_detail") or []:
        text += f"\n    {error.get('exc_type')}: {error.get('exc_value')}"
    return text
