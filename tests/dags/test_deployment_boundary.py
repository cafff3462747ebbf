"""The trust boundary in the real DAG (`airflow dags test`, SQLite): under a deployment file, a run
whose conf sets a deployment setting or names a config file of nested aliases fails in validate, naming the
key, and nothing after it runs (every other refusal of the loader: tests/mlm_tasks/test_deployment.py, the
same function validate calls); the form shows only run settings (tests/dags/test_dag_integrity.py)."""

from __future__ import annotations

import pytest

from peers.airflow_db import db_rows
from peers.airflow_home import airflow_env, dags_test  # noqa: F401  (fixture)
from peers.hostile import billion_laughs
from peers.tiny_data import TINY_FORM, TINY_YAML


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


# What a user who may only trigger runs sends through the REST conf, and what validate's refusal says.
HOSTILE = {
    "deployment-setting": (
        {"overrides": {"tpu.api_endpoint": "http://attacker.example"}},
        "tpu.api_endpoint is a deployment setting: the trigger's settings may not set it",
    ),
    "billion-laughs": ({"config_file": "lol.yaml"}, "lol uses a YAML anchor or alias (&l0): config files may not"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_conf_fails_in_validate_naming_the_key(case, deployment_env, tmp_path):
    env, tiny = deployment_env
    settings, message = HOSTILE[case]
    (tiny.parent / "lol.yaml").write_text(billion_laughs())
    conf = {
        **TINY_FORM,
        "config_file": str(tiny),
        "output_root": str(tmp_path / "out"),
        "steps": 2,
        **settings,
    }
    conf["config_file"] = str(tiny.parent / conf["config_file"])
    result = dags_test(env, "mlm_pretrain", conf=conf, timeout=600)
    log = result.stdout + result.stderr
    assert message in log, log[-4000:]
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
