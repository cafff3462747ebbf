"""The Airflow side of the pipeline, one module or package per Airflow role; all ML logic is in mlm_tasks.

    tasks/        the step tasks (steps.py), the shard-set task group (shard_set.py), a task's config and
                  RunContext from XCom (step_context.py)
    operators/    the TPU VM create/delete (tpu_vm.py), train (train.py), the step over SSH on a TPU VM
                  (remote_step.py), the release approval (release_approval.py)
    triggers/     the waits in the triggerer: a TPU VM's state (tpu_vm.py), a detached trainer (train_job.py)
    sensors/      the shard gate (shard_set.py)
    connections   GCP credentials, the Hub token, the SSH login to a TPU VM worker, from Airflow connections
    defaults      what every DAG shares: default_args, the form's fields, the worker queues
    notifications the failure alert; errors: a NoRetryError fails the task without retries
    assets        the mlm_shards asset and its events

Airflow puts plugins/ on sys.path (scheduler, workers, triggerer, dag-processor), so DAGs import it by
name: `from mlm_airflow.operators.train import TrainOperator`.
"""
