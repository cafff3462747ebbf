"""The trust boundary in the real DAG (`airflow dags test`, SQLite): under a deployment file, a run
whose conf sets a deployment setting fails in validate, naming the key, and nothing after it runs;
the form shows only run settings (tests/dags/test_dag_integrity.py)."""

from __future__ import annotations

import pytest

from peers.airflow_db import db_rows
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.tiny_data import TINY_YAML


@pytest.fixture
def deployment_env(airflow_env, tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tiny.yaml").write_text(TINY_YAML.read_text())
    path = tmp_path / "deployment.yaml"
    path.write_text(
        f"settings: {{tpu: {{project: team-project}}}}\noutput_roots: [{tmp_path / 'out'}]\nconfig_dirs: [{configs}]\n"
    )
    return {**airflow_env, "MLM_DEPLOYMENT": str(path)}, configs / "tiny.yaml"


@pytest.mark.slow
def test_a_conf_that_sets_a_deployment_setting_fails_in_validate(deployment_env, tmp_path):
    env, tiny = deployment_env
    conf = {
        "config_file": str(tiny),
        "output_root": str(tmp_path / "out"),
        "vocab_size": 1000,
        "max_length": 64,
        "steps": 2,
        "batch_size": 8,
        "overrides": {"tpu.api_endpoint": "http://attacker.example"},
    }
    result = dags_test(env, "mlm_pretrain", conf=conf, timeout=600)
    log = result.stdout + result.stderr
    assert "tpu.api_endpoint is a deployment setting: the trigger's settings may not set it" in log, log[-4000:]
    states = dict(
        db_rows(
            env,
            "SELECT task_id, state FROM task_instance WHERE run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = 'mlm_pretrain' ORDER BY id DESC LIMIT 1)",
        )
    )
    assert states["validate"] == "failed"
    assert not {t for t, s in states.items() if s == "success"}, states  # nothing ran after it
    assert not (tmp_path / "out").exists()
