"""The triggerer finds our triggers by the classpath they serialize: in a fresh process where only Airflow
puts plugins/ on sys.path (settings.prepare_syspath_for_config_and_plugins, as in the triggerer), the
triggerer's own import_string resolves each one to its class."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = """
import sys
import airflow  # settings.initialize(): the plugins folder joins sys.path here, not before
from airflow._shared.module_loading import import_string
from airflow.settings import PLUGINS_FOLDER

assert PLUGINS_FOLDER in sys.path, (PLUGINS_FOLDER, sys.path)
for cls in ["mlm_airflow.triggers.tpu_vm.TpuNodeTrigger", "mlm_airflow.triggers.train_job.TrainJobTrigger"]:
    path = import_string(cls).classpath
    assert import_string(path) is import_string(cls), path
    print(path)
"""


def test_the_triggerer_imports_every_trigger_by_its_serialized_classpath(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONPATH=str(ROOT),
    )  # the repo root only: mlm_tasks
    done = subprocess.run(
        [sys.executable, "-c", CODE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [
        "mlm_airflow.triggers.tpu_vm.TpuNodeTrigger",
        "mlm_airflow.triggers.train_job.TrainJobTrigger",
    ]
