#!/usr/bin/env bash
# One-off setup for the Airflow stack, run by the `airflow-init` service of docker-compose.yaml
# (and by tests/peers/airflow_stack.py): check the secrets from .env, migrate the metadata
# database, and seed the SimpleAuthManager password file with AIRFLOW_ADMIN_PASSWORD.
# Safe to rerun: `airflow db migrate` is idempotent and the password file is rewritten.
set -euo pipefail

missing=()
for key in AIRFLOW__CORE__FERNET_KEY AIRFLOW__API__SECRET_KEY AIRFLOW__API_AUTH__JWT_SECRET AIRFLOW_ADMIN_PASSWORD; do
    value="${!key:-}"
    if [[ -z "$value" || "$value" == change-me* ]]; then
        missing+=("$key")
    fi
done
# The CeleryExecutor's broker (profile `celery`) has a password too.
if [[ "${AIRFLOW__CORE__EXECUTOR:-}" == *CeleryExecutor* && ( -z "${REDIS_PASSWORD:-}" || "${REDIS_PASSWORD}" == change-me* ) ]]; then
    missing+=("REDIS_PASSWORD")
fi
if (( ${#missing[@]} )); then
    echo "airflow-init: set ${missing[*]} in .env (copy .env.example: it shows how to make each value)" >&2
    exit 1
fi

airflow db migrate

# SimpleAuthManager reads user passwords from this JSON file; without it, it would invent one and
# print it to the api-server log. The first user of SIMPLE_AUTH_MANAGER_USERS gets the password.
python - <<'PY'
import json
import os

path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
user = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(",")[0].split(":")[0]
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as out:
    json.dump({user: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, out)
print(f"airflow-init: database migrated; user {user!r} can log in with AIRFLOW_ADMIN_PASSWORD")
PY
