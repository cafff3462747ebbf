"""A throwaway Airflow (SQLite, temp AIRFLOW_HOME) for running DAGs for real with `airflow dags test`.

    def test_x(airflow_env):
        result = dags_test(airflow_env, "mlm_tpu_janitor", conf={...})
        assert result.returncode == 0, result.stdout

`airflow_env` (session) migrates the database once and returns the environment for subprocesses:
this project's dags/ and plugins/ folders, no examples, repo root and plugins/ on PYTHONPATH.
Airflow runs in a subprocess because its settings are read once per process from AIRFLOW_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def migrated_home(home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a throwaway Airflow in `home` (this project's dags/ and plugins/, no examples),
    its SQLite database migrated. Also bench/bench_corpus_scale.py's, outside pytest."""
    base = dict(os.environ if base is None else base)
    env = {
        **base,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), base.get("PYTHONPATH", "")]),
    }
    done = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stdout}\n{done.stderr}")
    return env


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    return migrated_home(tmp_path_factory.mktemp("airflow_home"))


def dags_test(
    env: dict[str, str],
    dag_id: str,
    *,
    conf: dict | None = None,
    dagfile: str | Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`airflow dags test dag_id` (only `dagfile` is parsed when given, e.g. a test DAG in tmp_path);
    stdout holds the task logs."""
    args = [AIRFLOW, "dags", "test", dag_id]
    if conf is not None:
        args += ["--conf", json.dumps(conf)]
    # The fake_tpu fixture puts the GCP connection (its service-account key) and the TPU registry in this
    # process's env.
    passed = {k: os.environ[k] for k in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", "MLM_TPU_REGISTRY") if k in os.environ}
    env = {**env, **passed, **(extra_env or {})}
    if dagfile is not None:
        args += ["--dagfile-path", str(dagfile)]
        # Airflow only takes a DAG file from inside its dags folder (the bundle).
        if not Path(dagfile).resolve().is_relative_to(Path(env["AIRFLOW__CORE__DAGS_FOLDER"]).resolve()):
            env["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(dagfile).resolve().parent)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
