"""
### mlm_pretrain — raw text to a trained, evaluated RoBERTa masked LM

Validate every input → plan the data (fingerprint, Unigram tokenizer) → write the TFRecord shards,
one mapped task per corpus partition (`shards.partitions`) → merge them into one manifest (all reused
when the corpus fingerprint is unchanged) → wait for the complete shard set → [create TPU VM] → train (resumes
from its last checkpoint on retry) → evaluate → fill-mask examples → report → evaluation gate →
publish to the Hub (skipped, with the reason, unless enabled and the gate passed) → summary →
[delete TPU VM, a teardown: runs whatever happened upstream].

The same DAG runs the embedded default (local folder, this machine's CPU, the Wikipedia sample
shipped with gensim) and production (`output_root: gs://…`, `compute: tpu_vm`): configuration
only. Trigger it with the form: every field is checked by `validate_config` before any work, and a
misspelled key in **overrides** is an error, not a silent default. Settings are documented in
`mlm_tasks/config.py`; example files live in `configs/`.

Scheduled on the `mlm_shards` asset: when `mlm_dataset_refresh` builds new shards, a run starts
and trains on exactly the fingerprint in the event.

Artifacts: `<output_root>/datasets/<fingerprint>/` (tokenizer, shards, manifest) and
`<output_root>/runs/<run_id>/` (checkpoints, model, metrics, predictions, TensorBoard logs).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, chain

import pipeline_tasks as steps
from dag_defaults import PARTITION_LABEL, config_params, default_args, default_config, form_params
from mlm_assets import SHARDS
from shard_gate import ShardSetCompleteSensor
from tpu_operators import TpuVmCreateOperator, TpuVmDeleteOperator
from train_operator import TrainOperator
from worker_queues import CPU_QUEUE, train_queue

_defaults = default_config()

params = {
    **config_params(_defaults, "Local folder or gs://bucket/prefix where every artifact goes.",
                    '{"train.checkpoint_every": 100}'),
    **form_params(_defaults, {
        "compute": "Compute", "corpus_source": "Corpus source", "vocab_size": "Vocabulary size",
        "max_length": "Sequence length", "model_preset": "Model preset", "steps": "Training steps",
        "batch_size": "Batch size per replica", "learning_rate": "Learning rate",
    }),
}
params["overrides"] = params.pop("overrides")  # last in the form: the catch-all

with DAG(
    dag_id="mlm_pretrain",
    description="Pretrain a RoBERTa masked LM with Transformers on TensorFlow (CPU or TPU VM).",
    doc_md=__doc__,
    # Runs when mlm_dataset_refresh announces new shards, and whenever triggered from the UI or API.
    schedule=[SHARDS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    default_args=default_args(),
    params=params,
    render_template_as_native_obj=True,
    tags=["mlm", "training", "tensorflow"],
) as dag:
    validate = PythonOperator(task_id="validate_config", python_callable=steps.validate_config, retries=0)
    plan = PythonOperator(task_id="plan_shards", python_callable=steps.plan_shards, queue=CPU_QUEUE)
    # One task per corpus partition (shards.partitions), run in parallel by the executor.
    write = PythonOperator.partial(
        task_id="write_shards", python_callable=steps.write_shards, execution_timeout=timedelta(hours=24),
        map_index_template=PARTITION_LABEL, queue=CPU_QUEUE,
    ).expand(op_kwargs=plan.output)
    # Runs when nothing was left to write too (write_shards mapped over no partition is skipped).
    prepare = PythonOperator(task_id="prepare_data", python_callable=steps.prepare_data, trigger_rule="none_failed",
                             queue=CPU_QUEUE)
    wait = ShardSetCompleteSensor(
        task_id="wait_for_shards",
        gcp_conn_id="{{ ti.xcom_pull(task_ids='validate_config')['sensor']['gcp_conn_id'] }}",
        poke_interval=_defaults.sensor.poke_interval_s,
        timeout=_defaults.sensor.timeout_s,
        retries=0,
    )
    create_vm = TpuVmCreateOperator(task_id="create_tpu_vm", config=steps.CONFIG_XCOM)
    # Queues are fixed at parse time: train follows the default config's compute (see worker_queues).
    train = TrainOperator(task_id="train", config=steps.CONFIG_XCOM, execution_timeout=timedelta(hours=72),
                          queue=train_queue(_defaults.compute))
    evaluate = PythonOperator(task_id="evaluate", python_callable=steps.evaluate, queue=CPU_QUEUE)
    fill_mask = PythonOperator(task_id="fill_mask", python_callable=steps.fill_mask, queue=CPU_QUEUE)
    report = PythonOperator(task_id="report", python_callable=steps.report, queue=CPU_QUEUE)
    gate = PythonOperator(task_id="gate", python_callable=steps.gate)
    publish = PythonOperator(task_id="publish", python_callable=steps.publish)
    push_tokenizer = PythonOperator(task_id="publish_tokenizer", python_callable=steps.publish_tokenizer)
    # Runs when publishing was skipped too: the summary is wanted either way.
    summary = PythonOperator(task_id="summary", python_callable=steps.summarize, trigger_rule="none_failed")
    delete_vm = TpuVmDeleteOperator(task_id="delete_tpu_vm", config=steps.CONFIG_XCOM)

    chain(validate, plan, write, prepare, wait, create_vm, train, evaluate, fill_mask, report, gate, publish, summary)
    prepare >> push_tokenizer
    # Teardown: runs after any upstream failure too, so no TPU VM outlives its run.
    train >> delete_vm.as_teardown(setups=create_vm)
