"""DAG integrity: every DAG loads, has docs, owner, tags and retries; the form's defaults are valid."""
import pytest

pytest.importorskip("airflow")


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    root = Path(__file__).resolve().parents[2]
    bag = DagBag(dag_folder=str(root / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag


def test_every_dag_is_documented_owned_tagged_and_retried(dagbag):
    assert dagbag.dags
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and dag.tags, dag_id
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", (dag_id, task.task_id)
            assert task.retries is not None, (dag_id, task.task_id)


def test_pretrain_shape_and_teardown(dagbag):
    dag = dagbag.dags["mlm_pretrain"]
    order = ["validate_config", "plan_shards", "write_shards", "prepare_data", "wait_for_shards", "create_tpu_vm", "train", "evaluate",
             "fill_mask", "report", "gate", "publish", "summary"]
    for up, down in zip(order, order[1:]):
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    delete = dag.get_task("delete_tpu_vm")
    assert delete.is_teardown and "create_tpu_vm" in delete.upstream_task_ids
    assert dag.get_task("create_tpu_vm").is_setup
    assert dag.get_task("train").retries >= 1


def test_param_defaults_build_a_valid_config(dagbag):
    from mlm_tasks.config import config_from_params

    dag = dagbag.dags["mlm_pretrain"]
    params = {k: dag.params[k] for k in dag.params}
    cfg = config_from_params(params)
    assert cfg.compute == "local" and cfg.corpus.source == "embedded_wiki"
    for name in params:
        p = dag.params.get_param(name)
        assert p.schema.get("title") and (p.description or p.schema.get("description")), name
