# mypy: disable-error-code="arg-type"
# (TaskFlow calls with XComArgs, and chain() of them: Airflow's stubs type run-time values, apache/airflow#39514)
"""
### mlm_pretrain — raw text to a trained, evaluated masked LM (RoBERTa or ModernBERT)

Each task runs the step of the same name in `mlm_tasks/steps/` (the chain: docs/architecture.md). An unchanged
corpus reuses its shard set; `wait_for_shards` waits only for shards made elsewhere; `train` resumes from its last
checkpoint; with `compute: tpu_vm`, train, evaluate, downstream and fill_mask run on the run's TPU VM (with
`compute: local` the TPU VM tasks end skipped); `publish` runs unless it is off, the gate failed or a person
rejected the release at `approve_release` (`publish.require_approval`).

The same DAG runs the embedded default (local folder, CPU) and production (`output_root: gs://…`,
`compute: tpu_vm`): configuration only. Every form field is checked by `validate` before any work; a
misspelled key in **overrides** is an error. Scheduled on the `mlm_shards` asset: a run trains on exactly
the fingerprint `mlm_dataset_refresh` announced.

Artifacts: `<output_root>/datasets/<fingerprint>/` (tokenizer, shards, manifest) and
`<output_root>/runs/<run_id>/` (checkpoints, model, metrics, predictions, TensorBoard logs).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, chain

from mlm_airflow.assets import SHARDS
from mlm_airflow.defaults import config_params, default_args, default_config, form_params, train_queue
from mlm_airflow.operators.release_approval import ReleaseApprovalOperator
from mlm_airflow.operators.tpu_vm import TpuVmCreateOperator, TpuVmDeleteOperator
from mlm_airflow.operators.train import TrainOperator
from mlm_airflow.sensors.shard_set import ShardSetCompleteSensor
from mlm_airflow.tasks import steps
from mlm_airflow.tasks.shard_set import shard_set

_defaults = default_config()

params = {
    **config_params(
        _defaults, "Local folder or gs://bucket/prefix where every artifact goes.", '{"train.checkpoint_every": 100}'
    ),
    **form_params(
        _defaults,
        {
            "compute": "Compute",
            "corpus_source": "Corpus source",
            "vocab_size": "Vocabulary size",
            "max_length": "Sequence length",
            "architecture": "Model architecture",
            "model_preset": "Model preset",
            "init_from": "Continue from (base model)",
            "init_revision": "Base model revision",
            "steps": "Training steps",
            "budget_minutes": "Time budget (minutes, a deadline)",
            "batch_size": "Batch size per replica",
            "learning_rate": "Learning rate",
            "accelerator_type": "TPU type",
            "runtime_version": "TPU runtime",
        },
    ),
}
params["overrides"] = params.pop("overrides")  # last in the form: the catch-all

with DAG(
    dag_id="mlm_pretrain",
    description="Pretrain a RoBERTa or ModernBERT masked LM on TensorFlow (CPU or TPU VM).",
    doc_md=__doc__,
    schedule=[SHARDS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    default_args=default_args(),
    params=params,
    tags=["mlm", "training", "tensorflow"],
) as dag:
    config = steps.validate()
    data = shard_set(config)
    # Waits only for shards from elsewhere (a refresh, bring-your-own); passes at once when this run wrote them.
    wait = ShardSetCompleteSensor(task_id="wait_for_shards", config=config, data=data, retries=0)
    create_vm = TpuVmCreateOperator(task_id="create_tpu_vm", config=config)
    on_compute = train_queue(_defaults.compute)  # fixed at parse time, by the default config's compute
    # none_failed: with compute local, create_tpu_vm is skipped and train still runs; a failed one stops it.
    # (Hence create_tpu_vm is no setup task: Airflow skips all of a skipped setup's scope.)
    train = TrainOperator(
        task_id="train",
        config=config,
        data=data,
        execution_timeout=timedelta(hours=72),
        queue=on_compute,
        trigger_rule="none_failed",
    )
    decision = steps.gate(config)
    # Always in the DAG (the setting is per run): it skips itself unless the run asks for approval.
    approval = ReleaseApprovalOperator(
        task_id="approve_release",
        config=config,
        decision=decision,
        default_timeout_hours=_defaults.publish.approval_timeout_hours,
    )
    # none_failed: publish runs after a skipped approval (none asked for) and decides on its own.
    published = steps.publish.override(trigger_rule="none_failed")(config, decision, data, approval.output)
    judged = steps.fill_mask.override(queue=on_compute)(config)  # the last step on the VM, before its delete
    chain(
        data,
        steps.check_run(config, data),
        wait,
        create_vm,
        train,
        steps.evaluate.override(queue=on_compute)(config, data),
        steps.downstream.override(queue=on_compute)(config),
        judged,
        steps.report(config, data),
        decision,
        approval,
        published,
        steps.summary(config, data),
    )
    data >> steps.publish_tokenizer(config, data)
    # A teardown without a setup: it runs once create_tpu_vm, train and the steps on the VM are done, whatever
    # happened (a failed create too), so no TPU VM outlives its run. Its failure does not decide the run's state.
    [create_vm, train, judged] >> TpuVmDeleteOperator(task_id="delete_tpu_vm", config=config).as_teardown()
