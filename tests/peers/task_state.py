"""The task state store of an Airflow task instance (`context["task_state_store"]`), kept in a JSON file.

    store = FileTaskState(tmp_path / "state.json")
    context = {..., "task_state_store": store}      # get(key, default) / set(key, value) / delete(key)

Airflow keeps the store in its database, scoped to the task instance, so it survives the task's
process and its retries; this file does the same across processes of a test (a task runner that a
test SIGKILLs, then the retry). Same methods and JSON-only values as Airflow's TaskStateStoreAccessor.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
