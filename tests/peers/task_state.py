"""The task state store of an Airflow task instance (`context["task_state_store"]`), kept in a JSON file.

    store = FileTaskState(tmp_path / "state.json")
    context = {..., "task_state_store": store}      # get(key, default) / set(key, value) / delete(key)
    runner = start_train_task(config, run_id, store.path, log_path)   # try 1 of `train` (task and trigger), to SIGKILL

Airflow keeps the store in its database, scoped to the task instance, so it survives the task's
process and its retries; this file does the same across processes of a test (a task runner that a
test SIGKILLs, then the retry). Same methods and JSON-only values as Airflow's TaskStateStoreAccessor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# One try of the train task in a process of its own, as its task runner and its trigger (peers/deferral.py).
TRAIN_TASK = """import json, sys
from types import SimpleNamespace
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/plugins", sys.argv[1] + "/tests"]
from peers.deferral import run_deferrable
from peers.task_state import FileTaskState
from mlm_airflow.operators.train import TrainOperator
context = {"dag": SimpleNamespace(dag_id="mlm_pretrain"), "run_id": sys.argv[3],
           "ti": SimpleNamespace(try_number=int(sys.argv[5])), "task_state_store": FileTaskState(sys.argv[4])}
op = TrainOperator(task_id="train", config=json.loads(sys.argv[2]), data=json.loads(sys.argv[6]))
run_deferrable(op, lambda: context, timeout=600)
"""


def start_train_task(
    config: dict, run_id: str, store: Path, log: Path, *, try_number: int = 1, data: dict | None = None
) -> subprocess.Popen:
    """One try of the train task in a subprocess (its output in `log`), with this process's environment."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                TRAIN_TASK,
                str(ROOT),
                json.dumps(config),
                run_id,
                str(store),
                str(try_number),
                json.dumps(data or {"fingerprint": "fp123"}),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class FileTaskState:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        if value is None:
            raise ValueError("Cannot set value as None")
        data = {**self._read(), key: json.loads(json.dumps(value))}  # JSON values only, as Airflow's
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def delete(self, key: str) -> None:
        data = self._read()
        data.pop(key, None)
        self.path.write_text(json.dumps(data))
