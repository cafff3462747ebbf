"""Queue routing of every task of the project's DAGs, and the local-output_root check under a
distributed executor.

    .venv/bin/python -m pytest tests/plugins/test_worker_queues.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlm_tasks.errors import ConfigError
from mlm_tasks.output_root import check_output_root_reachable
from mlm_tasks.steps import SHARD_SET_STEPS

ROOT = Path(__file__).resolve().parents[2]

# The routing docs/operations.md documents: CPU-heavy work on `cpu`, light drivers on `control`.
SHARD_SET = set(SHARD_SET_STEPS)
CPU_TASKS = {
    "mlm_pretrain": {
        *SHARD_SET,
        "train",
        "evaluate",
        "downstream",
        "fill_mask",
        "report",
    },
    "mlm_dataset_refresh": SHARD_SET,
    "mlm_tpu_janitor": set(),
}


def _queues(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """{dag_id: {task_id: queue}} as a dag-processor with this environment parses the DAG folder."""
    code = (
        "import json; from airflow.dag_processing.dagbag import DagBag; "
        f"bag = DagBag(dag_folder={str(ROOT / 'dags')!r}); "
        "assert not bag.import_errors, bag.import_errors; "
        "print(json.dumps({d: {t.task_id: t.queue for t in dag.tasks} for d, dag in bag.dags.items()}))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def parse_env(tmp_path_factory) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path_factory.mktemp("home")),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins")]),
    }


def test_every_task_is_routed_to_its_queue(parse_env):
    queues = _queues(parse_env)
    assert set(queues) == set(CPU_TASKS)
    for dag_id, tasks in queues.items():
        expected = {t: "cpu" if t in CPU_TASKS[dag_id] else "control" for t in tasks}
        assert tasks == expected, dag_id
    assert {"create_tpu_vm", "delete_tpu_vm", "wait_for_shards", "publish", "validate"} <= {
        t for t, q in queues["mlm_pretrain"].items() if q == "control"
    }


def test_queue_names_are_settings_read_at_parse_time(parse_env):
    queues = _queues({**parse_env, "MLM_CPU_QUEUE": "heavy", "MLM_CONTROL_QUEUE": "light"})
    assert queues["mlm_dataset_refresh"]["write_shards"] == "heavy"
    assert queues["mlm_dataset_refresh"]["validate"] == "light"
    assert set(queues["mlm_pretrain"].values()) == {"heavy", "light"}


def test_train_queue_follows_the_default_compute():
    from mlm_airflow.defaults import CONTROL_QUEUE, CPU_QUEUE, train_queue

    assert train_queue("tpu_vm") == CONTROL_QUEUE and train_queue("local") == CPU_QUEUE


@pytest.mark.parametrize(
    "executor, expected",
    [
        ("LocalExecutor", None),
        ("CeleryExecutor", "CeleryExecutor"),
        ("LocalExecutor,CeleryExecutor", "CeleryExecutor"),
        ("airflow.providers.celery.executors.celery_executor.CeleryExecutor", "CeleryExecutor"),
        ("KubernetesExecutor", "KubernetesExecutor"),
        ("SequentialExecutor", None),
    ],
)
def test_distributed_executor_is_read_from_airflow_conf(executor, expected, monkeypatch):
    from airflow.configuration import conf

    from mlm_airflow.defaults import distributed_executor

    monkeypatch.setattr(
        conf,
        "get",
        lambda section, key, fallback=None: executor if (section, key) == ("core", "executor") else fallback,
    )
    assert distributed_executor() == expected


def test_local_output_root_refused_under_a_distributed_executor(tmp_path):
    out = str(tmp_path / "out")
    check_output_root_reachable(out, None)  # one machine: fine
    check_output_root_reachable("gs://bucket/prefix", "CeleryExecutor")  # every worker reaches gs://
    check_output_root_reachable(out, "CeleryExecutor", [str(tmp_path)])  # declared shared mount
    with pytest.raises(
        ConfigError,
        match=r"local folder, but the CeleryExecutor may run .* Use output_root "
        r"gs://bucket/prefix, or, if this folder is a shared mount .* "
        r"MLM_SHARED_OUTPUT_ROOTS=",
    ):
        check_output_root_reachable(out, "CeleryExecutor", [str(tmp_path / "other")])
    with pytest.raises(ConfigError):  # a sibling whose name merely starts like the mount is not inside it
        check_output_root_reachable(str(tmp_path) + "-x/out", "CeleryExecutor", [str(tmp_path)])
