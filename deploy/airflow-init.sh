#!/usr/bin/env bash
# One-off setup for the Airflow stack, run by the `airflow-init` service of docker-compose.yaml
# (and by tests/peers/airflow_stack.py): check the secrets, migrate the metadata database (Airflow's
# tables and the FAB auth manager's), give the Celery result backend a database and role of its own,
# and create (or update) the `admin` user with AIRFLOW_ADMIN_PASSWORD.
# Safe to rerun: each step is idempotent, and a changed password in .env is applied on the next run.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$here/check-secrets.sh"

# As PostgreSQL's superuser (the only step that is): Airflow's own role, which owns the metadata
# database and is no superuser, and the Celery result backend's role and database.
python "$here/metadata-db.py"
python "$here/result-backend-db.py"

airflow db migrate

python "$here/fab-roles.py"

# The password reaches the script in its environment, never on a command line.
MLM_USER_PASSWORD_ADMIN="$AIRFLOW_ADMIN_PASSWORD" python "$here/fab-user.py" admin=Admin
echo "airflow-init: done; user 'admin' (role Admin) logs in with AIRFLOW_ADMIN_PASSWORD"
