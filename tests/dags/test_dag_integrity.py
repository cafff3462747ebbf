"""DAG integrity: every DAG loads, has docs, owner, tags, retries and execution timeouts; the form's defaults are
valid."""

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
            # Nothing may wait for ever: train sets its own from the config, the rest get the default.
            assert task.execution_timeout and task.execution_timeout.total_seconds() > 0, (dag_id, task.task_id)


def test_pretrain_shape_and_teardown(dagbag):
    dag = dagbag.dags["mlm_pretrain"]
    order = [
        "validate",
        "plan_shards",
        "write_shards",
        "merge_shards",
        "check_run",
        "wait_for_shards",
        "create_tpu_vm",
        "train",
        "evaluate",
        "downstream",
        "fill_mask",
        "report",
        "gate",
        "approve_release",
        "publish",
        "summary",
    ]
    for up, down in zip(order, order[1:], strict=False):
        assert down in dag.get_task(up).downstream_task_ids, (up, down)
    delete = dag.get_task("delete_tpu_vm")
    # After the steps that judge the model on the VM (compute tpu_vm): the VM lives until fill_mask is done.
    assert delete.is_teardown and {"create_tpu_vm", "train", "fill_mask"} <= delete.upstream_task_ids
    # create_tpu_vm skips with compute local: not a setup (Airflow would skip its whole scope), and train
    # runs after a skipped one; the merge runs when write_shards was skipped (nothing to write).
    assert not dag.get_task("create_tpu_vm").is_setup
    assert dag.get_task("train").trigger_rule == "none_failed"
    assert dag.get_task("merge_shards").trigger_rule == "none_failed"
    assert dag.get_task("train").retries >= 1


def test_approve_release_is_airflows_approval_between_gate_and_publish(dagbag):
    """publish.require_approval is per run, the DAG's shape is not: the approval task is always there
    (it skips itself when not asked), and publish runs after a skipped one (none_failed). A rejection
    skips publish alone (its direct downstream): summary still runs."""
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from mlm_airflow.defaults import default_config

    dag = dagbag.dags["mlm_pretrain"]
    approval = dag.get_task("approve_release")
    assert isinstance(approval, ApprovalOperator)
    assert {"gate", "validate"} <= approval.upstream_task_ids and approval.downstream_task_ids == {"publish"}
    assert dag.get_task("publish").trigger_rule == "none_failed"
    assert dag.get_task("summary").trigger_rule == "none_failed"
    # No answer by the deadline takes the default, Reject: a timeout is a rejection, not a failure.
    assert approval.defaults == ["Reject"] and not approval.fail_on_reject
    assert approval.response_timeout.total_seconds() == default_config().publish.approval_timeout_hours * 3600
    # The form a person fills in is the comment alone, not the trigger form's params.
    assert set(approval.serialized_params) == {"comment"}


def test_param_defaults_build_a_valid_config(dagbag):
    from mlm_tasks.config import config_from_params

    dag = dagbag.dags["mlm_pretrain"]
    params = {k: dag.params[k] for k in dag.params}
    cfg = config_from_params(params)
    assert cfg.compute == "local" and cfg.corpus.source == "embedded_wiki"
    for name in params:
        p = dag.params.get_param(name)
        assert p.schema.get("title") and (p.description or p.schema.get("description")), name


def test_form_and_validator_agree_on_every_bound_and_choice(dagbag):
    """The form's fields are generated from the config model: a value the form refuses at a bound,
    the validator refuses too, and every choice the form offers the validator accepts."""
    from airflow.sdk import Param

    from mlm_tasks.config import PARAM_PATHS, config_from_params
    from mlm_tasks.errors import ConfigError

    dag = dagbag.dags["mlm_pretrain"]
    base = {k: dag.params[k] for k in dag.params}
    checked = 0
    for name in dag.params:
        if name not in PARAM_PATHS or name == "output_root":
            continue
        schema = dag.params.get_param(name).schema
        outside = []
        if "minimum" in schema:
            outside.append(schema["minimum"] - (1 if "integer" in str(schema["type"]) else 1e-9))
        if "exclusiveMinimum" in schema:
            outside.append(schema["exclusiveMinimum"])
        if "maximum" in schema:
            outside.append(schema["maximum"] + 1)
        if "exclusiveMaximum" in schema:
            outside.append(schema["exclusiveMaximum"])
        for value in outside:
            with pytest.raises(Exception):  # noqa: B017  (whichever error Param raises: the value is refused)
                Param(value, **schema).resolve()
            with pytest.raises(ConfigError):
                config_from_params({**base, name: value})
            checked += 1
        for choice in schema.get("enum", []):
            Param(choice, **schema).resolve()
            if (name, choice) in (("compute", "tpu_vm"), ("corpus_source", "mixture")):
                continue  # valid on its own, but needs a gs:// output_root / a corpus.mixture (cross-field rules)
            config_from_params({**base, name: choice})
            checked += 1
    assert checked >= 10


def test_the_form_picks_a_tpu_type_and_its_runtime(dagbag):
    """A pod slice from the form alone: the runtime field offers the supported runtimes (the -pod ones
    among them), so v4-32 validates with its -pod runtime and fails, naming it, without."""
    from mlm_tasks.config import config_from_params
    from mlm_tasks.errors import ConfigError
    from mlm_tasks.tpu import runtimes

    dag = dagbag.dags["mlm_pretrain"]
    assert dag.params.get_param("runtime_version").schema["enum"] == sorted(runtimes.SUPPORTED)
    form = {
        **{k: dag.params[k] for k in dag.params},
        "compute": "tpu_vm",
        "output_root": "gs://bkt/p",
        "overrides": {"tpu.project": "p"},
        "accelerator_type": "v4-32",
    }
    cfg = config_from_params({**form, "runtime_version": "tpu-vm-tf-2.16.1-pod-pjrt"})
    assert (cfg.tpu.accelerator_type, cfg.tpu.runtime_version) == ("v4-32", "tpu-vm-tf-2.16.1-pod-pjrt")
    with pytest.raises(ConfigError, match="tpu-vm-tf-2.16.1-pod-pjrt"):
        config_from_params({**form, "runtime_version": "tpu-vm-tf-2.16.1-pjrt"})


def test_the_forms_show_only_run_settings(dagbag):
    """Deployment settings (connections, project, endpoints, the VM's environment) come from the
    deployment file, never from a trigger form (mlm_tasks/config/deployment.py)."""
    from mlm_tasks.config import PARAM_PATHS
    from mlm_tasks.config.deployment import DEPLOYMENT_KEYS

    for dag in dagbag.dags.values():
        for name in dag.params:
            dotted = PARAM_PATHS.get(name, name)
            assert not any(dotted == k or dotted.startswith(k + ".") for k in DEPLOYMENT_KEYS), (dag.dag_id, name)
            assert name not in ("project", "api_endpoint", "transport"), (dag.dag_id, name)
