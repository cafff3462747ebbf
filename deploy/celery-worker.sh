#!/usr/bin/env bash
# A Celery worker, run by the `airflow-worker` service of docker-compose.yaml (profile `celery`), by
# a worker on another machine (docs/operations.md: "Add a worker on another machine"), and by
# tests/peers/airflow_stack.py. Extra arguments go to `airflow celery worker` (e.g. --celery-hostname).
#
#   MLM_WORKER_QUEUES   queues this worker consumes, comma-separated (default: MLM_CPU_QUEUE,MLM_CONTROL_QUEUE,
#                       i.e. cpu,control: it runs everything). A TPU-driver machine: control; a big CPU box: cpu.
#   AIRFLOW__CELERY__WORKER_CONCURRENCY   task slots (tasks this worker runs at once)
set -euo pipefail

executor="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
if [[ "$executor" != *CeleryExecutor* ]]; then
    echo "airflow-worker: the executor is $executor, so no task would ever reach this worker. Set" \
         "MLM_EXECUTOR=CeleryExecutor in .env (or on the command line) and start the celery profile:" \
         "docker compose --profile celery up -d" >&2
    exit 1
fi
# The worker holds the broker's password only inside its URL (it gets no REDIS_PASSWORD of its own).
broker="${AIRFLOW__CELERY__BROKER_URL:-}"
if [[ ! "$broker" =~ ^redis://:[^@]+@ || "$broker" == redis://:change-me* ]]; then
    echo "airflow-worker: AIRFLOW__CELERY__BROKER_URL has no password or still change-me: set REDIS_PASSWORD" \
         "in .env (copy .env.example: it shows how to make it)" >&2
    exit 1
fi

queues="${MLM_WORKER_QUEUES:-${MLM_CPU_QUEUE:-cpu},${MLM_CONTROL_QUEUE:-control}}"
echo "airflow-worker: consuming queues $queues"
exec airflow celery worker --queues "$queues" "$@"
