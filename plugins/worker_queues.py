"""Where tasks run: the two Celery queues, and whether this deployment spreads a run over machines.

    from worker_queues import CPU_QUEUE, CONTROL_QUEUE, distributed_executor, shared_output_roots

Orchestration-only settings, so they live here (plugins) and in the environment, not in
`mlm_tasks.config` (which describes a run, and knows nothing of Airflow):

| variable | default | what |
|---|---|---|
| `MLM_CPU_QUEUE` | `cpu` | CPU-heavy: tokenizer, shards, merge, CPU training, evaluate, downstream, fill-mask, report |
| `MLM_CONTROL_QUEUE` | `control` | light drivers: validate, sensors, TPU VM create/delete, SSH driver, gate, publish |
| `MLM_SHARED_OUTPUT_ROOTS` | (empty) | local folders at the same path on every worker (NFS, Filestore), `:`-separated |

The queue is an operator attribute, fixed when the dag-processor parses the DAG files: set the two
names in the environment of the dag-processor (and of the workers that consume them, which the
compose file does for every service at once), then the next parse (about 30 s) routes new task
instances. A run's own settings cannot move a task to another queue. The LocalExecutor ignores
queues, so the default deployment runs everything whatever the names are.
"""
from __future__ import annotations

import os

CPU_QUEUE = os.environ.get("MLM_CPU_QUEUE", "").strip() or "cpu"
CONTROL_QUEUE = os.environ.get("MLM_CONTROL_QUEUE", "").strip() or "control"

# Executors whose tasks all run on the scheduler's machine. Every other executor (Celery, Kubernetes,
# Edge, ...) may run two tasks of one run on two machines.
SINGLE_MACHINE_EXECUTORS = {"LocalExecutor", "SequentialExecutor", "DebugExecutor"}


def train_queue(default_compute: str) -> str:
    """`train` drives a TPU VM over SSH (light) or trains on the worker's CPU (heavy). The queue is
    fixed at parse time, so it follows the compute of the default config file."""
    return CONTROL_QUEUE if default_compute == "tpu_vm" else CPU_QUEUE


def distributed_executor() -> str | None:
    """The name of the first configured executor that may run tasks on other machines, else None."""
    from airflow.configuration import conf

    for name in conf.get("core", "executor", fallback="LocalExecutor").split(","):
        name = name.strip().split(":")[-1].rsplit(".", 1)[-1]  # alias:module.Class or module.Class
        if name and name not in SINGLE_MACHINE_EXECUTORS:
            return name
    return None


def shared_output_roots() -> list[str]:
    return [p for p in os.environ.get("MLM_SHARED_OUTPUT_ROOTS", "").split(os.pathsep) if p.strip()]
