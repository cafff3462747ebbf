#!/usr/bin/env bash
# Refuse to start the deployment with a placeholder secret: every secret of .env.example must be set,
# and not to `change-me...` (the placeholder .env.example ships) nor empty. Run by airflow-init.sh
# (the `airflow-init` service, before anything touches the database) and by
# tests/deploy/test_check_secrets.py. Exits 1 naming each bad variable; prints no value.
#
#   bash deploy/check-secrets.sh            # reads the variables from the environment
set -euo pipefail

# The "Secrets" section of .env.example, in its order (test_check_secrets.py keeps the two in step).
SECRETS=(
    POSTGRES_PASSWORD
    POSTGRES_SUPERUSER_PASSWORD
    AIRFLOW_ADMIN_PASSWORD
    AIRFLOW__CORE__FERNET_KEY
    AIRFLOW__API__SECRET_KEY
    AIRFLOW__API_AUTH__JWT_SECRET
    REDIS_PASSWORD
    CELERY_RESULT_DB_PASSWORD
    FLOWER_PASSWORD
)

bad=()
for key in "${SECRETS[@]}"; do
    value="${!key:-}"
    if [[ -z "$value" || "$value" == change-me* ]]; then
        bad+=("$key")
    fi
done
if (( ${#bad[@]} )); then
    echo "check-secrets: ${bad[*]} still empty or change-me: set each in .env (copy .env.example:" \
         "it shows how to make each value), then docker compose up -d again" >&2
    exit 1
fi
echo "check-secrets: all ${#SECRETS[@]} secrets set"
