"""The Airflow side of the pipeline, one module or package per Airflow role; all ML logic is in mlm_tasks.

tasks/        the step tasks, the shard-set task group, the janitor's tasks, a task's config from XCom
operators/    TPU VM create/delete, train, a step over SSH on a TPU VM, the release approval
triggers/     the waits in the triggerer: a TPU VM's state, a detached trainer
sensors/      the shard gate
connections, defaults, notifications, errors, assets: credentials, DAG defaults, alerts, error kinds, events
"""
