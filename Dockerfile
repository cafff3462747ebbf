# The image every service of docker-compose.yaml runs: Airflow 3.3 + TensorFlow + this project.
#
#   docker compose build          # or: docker build -t mlm-airflow .
#
# Python 3.11 with the locked requirements.txt (installed with uv, as `make env` does locally), the
# mlm_tasks package, and dags/ plugins/ configs/ deploy/ at /opt/airflow (compose mounts the first
# three over these copies so edits need no rebuild).
FROM python:3.11-slim-bookworm

# tini reaps the task processes the LocalExecutor forks; curl serves the compose healthcheck;
# openssh-client lets operators debug the TPU VM connection from inside the scheduler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini curl openssh-client \
    && rm -rf /var/lib/apt/lists/*

ENV AIRFLOW_HOME=/opt/airflow \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TF_USE_LEGACY_KERAS=1 \
    PYTHONUNBUFFERED=1

# Dependencies first: this layer is rebuilt only when the lock changes; every wheel must match its hash. PostgreSQL drivers
# (psycopg2 for the scheduler, asyncpg for the api-server) are in requirements.txt.
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir uv==0.13.9 \
    && uv venv --python /usr/local/bin/python3.11 /opt/venv \
    && uv pip install --no-cache --require-hashes -r /tmp/requirements.txt

COPY pyproject.toml README.md /opt/mlm/
COPY mlm_tasks /opt/mlm/mlm_tasks
RUN uv pip install --no-cache --no-deps /opt/mlm

# Same uid as the official Airflow image, so volumes made for it keep working.
RUN useradd --uid 50000 --gid 0 --home-dir /opt/airflow --no-create-home airflow \
    && mkdir -p /opt/airflow/logs /opt/airflow/auth /opt/airflow/out \
    && chown -R airflow:0 /opt/airflow
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
COPY --chown=airflow:0 configs /opt/airflow/configs
# root-owned and read-only: the deployment file is the boundary every run is held to, and task code runs as
# `airflow` (compose also mounts it read-only over this copy).
COPY --chown=root:root --chmod=a=rX deploy /opt/airflow/deploy

USER airflow
WORKDIR /opt/airflow
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["airflow", "api-server"]
