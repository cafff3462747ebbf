"""docker-compose.yaml, Dockerfile and .env.example checked statically (no Docker engine runs here),
and held to what tests/peers/airflow_stack.py really runs: same services, commands, environment,
executor, ports and volumes, the only differences being the loopback ones it lists. The `celery`
profile (Redis, scalable workers, Flower under `flower`) is checked the same way. And the safety of
the defaults: the FAB auth manager, the api-server and Flower published on 127.0.0.1 only, which
secrets each service holds (no `env_file: .env` anywhere), and no secret on a command line.

    .venv/bin/python -m pytest tests/deploy/test_compose.py
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from peers import airflow_stack as stack
from peers.airflow_stack import ROOT, SERVICES, interpolate, load_compose, read_env_file, stack_spec

AIRFLOW_SERVICES = ("airflow-init", *SERVICES)
CELERY_PROFILE = {"redis": ["celery"], "airflow-worker": ["celery"], "airflow-flower": ["flower"]}
EXPECTED_COMMANDS = {
    "airflow-apiserver": ["airflow", "api-server"],
    "airflow-scheduler": ["airflow", "scheduler"],
    "airflow-dag-processor": ["airflow", "dag-processor"],
    "airflow-triggerer": ["airflow", "triggerer"],
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


@pytest.fixture(scope="module")
def spec(compose, tmp_path_factory):
    return stack_spec(tmp_path_factory.mktemp("home"), 15432, port=18080, compose=compose)


def test_services_and_shared_airflow_definition(compose):
    services = compose["services"]
    assert set(services) == {"postgres", *AIRFLOW_SERVICES, *CELERY_PROFILE}
    first = services[SERVICES[0]]
    common = compose["x-airflow-common"]["environment"]
    for name in (*AIRFLOW_SERVICES, "airflow-worker", "airflow-flower"):
        service = services[name]
        for key in ("build", "image", "working_dir"):
            assert service[key] == first[key], f"{name}.{key} differs from {SERVICES[0]}"
        # The shared settings, in every Airflow service; the secrets differ (test_who_holds_which_secret).
        assert {k: service["environment"][k] for k in common} == common, name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in SERVICES:
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert services[name]["command"] == EXPECTED_COMMANDS[name]
    env = first["environment"]
    dotenv = read_env_file(ROOT / ".env.example")
    # LocalExecutor by default (.env.example, or MLM_EXECUTOR unset); CeleryExecutor when .env says so.
    assert interpolate(env["AIRFLOW__CORE__EXECUTOR"], dotenv) == "LocalExecutor"
    assert interpolate(env["AIRFLOW__CORE__EXECUTOR"], {}) == "LocalExecutor"
    assert interpolate(env["AIRFLOW__CORE__EXECUTOR"], {**dotenv, "MLM_EXECUTOR": "CeleryExecutor"}) == "CeleryExecutor"
    # The default stack has no profile-only service.
    for name in (*AIRFLOW_SERVICES, "postgres"):
        assert "profiles" not in services[name], name
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__AUTH_MANAGER"] == "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
    assert not any(k.startswith("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER") for k in env)


def test_ui_on_localhost_8080_and_tasks_reach_the_api_server(compose):
    services = compose["services"]
    env = services["airflow-apiserver"]["environment"]
    # Published on this machine's loopback only: others reach it through a TLS proxy (docs/security.md).
    assert services["airflow-apiserver"]["ports"] == ["127.0.0.1:8080:8080"]
    assert env["AIRFLOW__API__PORT"] == "8080"
    execution = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (execution.hostname, execution.port, execution.path) == ("airflow-apiserver", 8080, "/execution/")
    # ${POSTGRES_PASSWORD:?...} is filled in by compose from .env.
    database = urlsplit(re.sub(r"\$\{[^}]*\}", "secret", env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
    assert database.scheme == "postgresql+psycopg2" and database.hostname == "postgres"
    assert database.username == "airflow" and "POSTGRES_USER" not in services["postgres"]["environment"]


def test_volumes_mount_project_folders_and_declared_named_volumes(compose):
    volumes = compose["x-airflow-common"]["volumes"]
    binds = {v.split(":")[1]: v.split(":")[0] for v in volumes if v.startswith(".")}
    assert binds == {
        "/opt/airflow/dags": "./dags",
        "/opt/airflow/plugins": "./plugins",
        "/opt/airflow/configs": "./configs",
        "/opt/airflow/deploy/deployment.yaml": "./deploy/deployment.yaml",
    }
    for source in binds.values():
        assert (ROOT / source).exists(), source
    named = {v.split(":")[0] for v in volumes if not v.startswith(".")}
    named.add(compose["services"]["postgres"]["volumes"][0].split(":")[0])
    named.add(compose["services"]["redis"]["volumes"][0].split(":")[0])
    named |= {v.split(":")[0] for v in compose["x-task-volumes"] if not v.startswith(".")}
    assert named == set(compose["volumes"]), "every named volume is declared at the top level"
    # The key files of the connections (airflow-auth) only where tasks and triggers run.
    assert compose["x-task-volumes"] == [*volumes, "airflow-auth:/opt/airflow/auth"]
    for name, service in compose["services"].items():
        mounts = service.get("volumes", [])
        assert ("airflow-auth:/opt/airflow/auth" in mounts) == (name in TASK_RUNNERS), name
    env = compose["x-airflow-common"]["environment"]
    mounted = {v.split(":")[1] for v in volumes}
    for key in (
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "MLM_CONFIG_DIR",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER",
    ):
        assert env[key] in mounted, f"{key} points outside the mounted volumes"


def test_harness_runs_the_same_commands_and_environment(compose, spec):
    services = compose["services"]
    for name in AIRFLOW_SERVICES:
        argv = spec.commands[name]
        assert Path(argv[0]).name == services[name]["command"][0]
        assert [
            stack.translate(a, stack.path_map(services[name], spec.home)) for a in services[name]["command"][1:]
        ] == argv[1:]
    assert Path(spec.commands["airflow-init"][1]) == ROOT / "deploy" / "airflow-init.sh"

    for name in (*AIRFLOW_SERVICES, "airflow-worker"):
        environment = services[name]["environment"]
        pairs = stack.path_map(services[name], spec.home)
        env = spec.envs[name]
        # Each process gets its service's environment, nothing of .env besides (AIRFLOW_HOME and PATH
        # are the image's ENV).
        assert set(env) == {*environment, "AIRFLOW_HOME", "PATH"}, name
        changed = {
            k for k, v in environment.items() if env[k] != stack.translate(interpolate(str(v), spec.dotenv), pairs)
        }
        # MLM_DEPLOYMENT: a copy of the file whose container paths are mapped the same way.
        assert changed == (set(stack.LOCAL_KEYS) | {"MLM_DEPLOYMENT"}) & set(environment), name
        for key in changed & {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW__CELERY__RESULT_BACKEND",
            "AIRFLOW__CELERY__BROKER_URL",
        }:  # only the peer's address differs
            there, here = urlsplit(interpolate(environment[key], spec.dotenv)), urlsplit(env[key])
            assert (here.scheme, here.username, here.password, here.path) == (
                there.scheme,
                there.username,
                there.password,
                there.path,
            ), key
            assert here.hostname == "127.0.0.1" and there.hostname in services, key
    env = spec.envs["airflow-apiserver"]
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(ROOT / "plugins")
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    assert urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).port == 15432


def test_env_example_holds_connections_and_secrets_and_env_is_ignored(compose):
    example = read_env_file(ROOT / ".env.example")
    for key in (
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        "AIRFLOW_CONN_TPU_SSH",
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT",
        *stack.GENERATED,
    ):
        assert key in example, key
    for key in stack.GENERATED:
        assert example[key].startswith("change-me"), f"{key}: .env.example must not hold a real secret"
    text = (ROOT / "docker-compose.yaml").read_text()
    for key in stack.GENERATED:  # only as ${KEY...} interpolated from .env, never a literal value
        assert not re.search(rf"^\s*{key}:\s*(?!\$\{{)\S", text, re.M), f"{key} belongs in .env"
    # Every key an operator sets in .env reaches some service (compose reads .env only to interpolate).
    for key in example:
        assert f"${{{key}" in text or key == "COMPOSE_PROFILES", f"{key} of .env.example reaches no service"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


# --- who holds which secret (docs/security.md, "Who holds which secret") ----------------------------

TASK_RUNNERS = {"airflow-scheduler", "airflow-triggerer", "airflow-worker"}  # run task or trigger code
ALL_SECRETS = set(stack.GENERATED)
HOLDS = {
    "postgres": {"POSTGRES_SUPERUSER_PASSWORD"},  # the superuser's; Airflow's own role is made by airflow-init
    "airflow-init": ALL_SECRETS,  # checks them all (deploy/check-secrets.sh), runs no task code
    "airflow-apiserver": {
        "POSTGRES_PASSWORD",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API__SECRET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET",
    },
    # Mints task tokens; under the LocalExecutor its tasks can read this (docs/security.md).
    "airflow-scheduler": {
        "POSTGRES_PASSWORD",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "REDIS_PASSWORD",
        "CELERY_RESULT_DB_PASSWORD",
    },
    "airflow-dag-processor": {"POSTGRES_PASSWORD", "AIRFLOW__CORE__FERNET_KEY"},
    "airflow-triggerer": {"POSTGRES_PASSWORD", "AIRFLOW__CORE__FERNET_KEY"},  # a DB job in Airflow 3.3
    "airflow-worker": {"REDIS_PASSWORD", "CELERY_RESULT_DB_PASSWORD"},
    "airflow-flower": {"REDIS_PASSWORD", "CELERY_RESULT_DB_PASSWORD", "FLOWER_PASSWORD"},
    "redis": {"REDIS_PASSWORD"},
}


def _unique_dotenv() -> dict[str, str]:
    """.env.example with a distinct, recognisable value for every secret."""
    return {
        **read_env_file(ROOT / ".env.example"),
        **{key: f"SECRET{i}x{key.lower()}" for i, key in enumerate(sorted(ALL_SECRETS))},
    }


def _secrets_in(text: str, dotenv: dict[str, str]) -> set[str]:
    return {key for key in ALL_SECRETS if dotenv[key] in text}


def test_who_holds_which_secret(compose):
    dotenv = _unique_dotenv()
    services = compose["services"]
    assert set(HOLDS) == set(services)
    for name, service in services.items():
        assert "env_file" not in service, f"{name} gets the whole .env"
        environment = " ".join(f"{k}={interpolate(str(v), dotenv)}" for k, v in service["environment"].items())
        assert _secrets_in(environment, dotenv) == HOLDS[name], name
    # The token and session keys and the metadata DB never reach a Celery worker (task code).
    worker = services["airflow-worker"]["environment"]
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in worker
    # The connections (credentials of the tasks' outside services) only where tasks and triggers run.
    for name, service in services.items():
        conns = {k for k in service.get("environment", {}) if k.startswith("AIRFLOW_CONN_")}
        assert bool(conns) == (name in TASK_RUNNERS), name


def test_no_secret_on_a_command_line(compose):
    """Nothing compose puts in argv (commands, healthchecks) carries a secret: `ps` and
    /proc/<pid>/cmdline show argv to every user of the machine."""
    dotenv = _unique_dotenv()
    for name, service in compose["services"].items():
        argv = [*service.get("command", []), *service.get("healthcheck", {}).get("test", [])]
        assert not _secrets_in(" ".join(interpolate(str(a), dotenv) for a in argv), dotenv), name
    for script in (ROOT / "deploy").glob("*.sh"):  # no script passes a secret variable as an argument
        for line in script.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for key in ALL_SECRETS:
                if f"${key}" in line or f"${{{key}" in line:
                    assert re.search(rf"(^|\s)(value=|hash=|\w+=\"\${key}\"|if \[\[)", line) or "printf" in line, (
                        f"{script.name}: {line.strip()}"
                    )


def test_dockerfile_builds_from_the_lock_and_copies_what_compose_uses():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
    assert "uv pip install --no-cache --require-hashes -r /tmp/requirements.txt" in dockerfile
    assert re.search(rf"AIRFLOW_HOME={stack.CONTAINER_HOME}\b", dockerfile)
    for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", dockerfile, re.M):
        *sources, _target = line.split()
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which the repo lacks"
    for folder in ("dags", "plugins", "configs"):
        assert f"COPY --chown=airflow:0 {folder} {stack.CONTAINER_HOME}/{folder}" in dockerfile
    # The deployment file is the boundary: the task user (airflow) may not rewrite it.
    assert f"COPY --chown=root:root --chmod=a=rX deploy {stack.CONTAINER_HOME}/deploy" in dockerfile


def test_image_has_the_postgres_drivers_the_stack_uses():
    lock = (ROOT / "requirements.txt").read_text().lower()
    for package in ("psycopg2-binary==", "asyncpg=="):
        assert re.search(rf"^{re.escape(package)}", lock, re.M), (
            f"{package.rstrip('=')} is not in requirements.txt: add it to requirements.in and `make lock` "
            "(the scheduler needs psycopg2, the api-server asyncpg)"
        )


def test_init_script_is_valid_bash_and_refuses_placeholder_secrets(tmp_path):
    script = ROOT / "deploy" / "airflow-init.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin", **{k: "change-me" for k in stack.GENERATED}}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "AIRFLOW__CORE__FERNET_KEY" in done.stderr and ".env.example" in done.stderr
    # More cases, the check script on its own: tests/deploy/test_check_secrets.py.


# --- the celery profile ----------------------------------------------------------------------------


def test_celery_profile_services_and_scaling(compose):
    """`docker compose --profile celery up -d --scale airflow-worker=3` is valid: the profile holds
    Redis and the workers, and a worker has nothing that two copies could not share."""
    services = compose["services"]
    for name, profiles in CELERY_PROFILE.items():
        assert services[name]["profiles"] == profiles, name
    worker = services["airflow-worker"]
    for key in ("container_name", "ports", "hostname"):  # a fixed name or host port breaks --scale
        assert key not in worker, f"airflow-worker.{key} prevents --scale"
    assert worker["command"] == ["bash", "/opt/airflow/deploy/celery-worker.sh"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert "celery@$${HOSTNAME}" in " ".join(worker["healthcheck"]["test"])
    # The scheduler waits for Redis when the profile is on, and starts without it when it is off.
    assert services["airflow-scheduler"]["depends_on"]["redis"] == {"condition": "service_healthy", "required": False}
    flower = services["airflow-flower"]
    assert flower["command"] == ["airflow", "celery", "flower"]
    # On this machine's loopback only, behind a login whose password comes from .env, not argv.
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    assert flower["environment"]["AIRFLOW__CELERY__FLOWER_BASIC_AUTH"].startswith("flower:${FLOWER_PASSWORD:?")


def test_celery_broker_and_result_backend(compose):
    env = compose["services"]["airflow-worker"]["environment"]
    metadata = compose["services"]["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    dotenv = read_env_file(ROOT / ".env.example")
    broker = urlsplit(interpolate(env["AIRFLOW__CELERY__BROKER_URL"], dotenv))
    assert (broker.scheme, broker.hostname, broker.port, broker.password) == ("redis", "redis", 6379, "change-me")
    backend = urlsplit(interpolate(env["AIRFLOW__CELERY__RESULT_BACKEND"], dotenv))
    database = urlsplit(interpolate(metadata, dotenv))
    # The result backend is a database and role of its own on the same PostgreSQL (deploy/result-backend-db.py).
    assert backend.scheme == "db+" + database.scheme and backend.hostname == database.hostname
    assert (backend.username, backend.path) == ("celery_results", "/celery_results")
    assert backend.username != database.username and backend.path != database.path
    redis = compose["services"]["redis"]
    assert redis["volumes"][0] == "redis-data:/data" and "redis-data" in compose["volumes"]
    # appendonly and the password: deploy/redis-server.sh, run for real in tests/deploy/test_redis_server.py.


def test_harness_runs_the_celery_profile_as_compose_does(compose, tmp_path):
    spec = stack_spec(
        tmp_path, 15432, port=18080, compose=compose, variables={"MLM_EXECUTOR": "CeleryExecutor"}, redis_port=16379
    )
    env = spec.envs["airflow-worker"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{spec.dotenv['REDIS_PASSWORD']}@127.0.0.1:16379/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == (
        f"db+postgresql+psycopg2://celery_results:{spec.dotenv['CELERY_RESULT_DB_PASSWORD']}@127.0.0.1:15432/celery_results"
    )
    assert spec.commands["airflow-worker"] == ["bash", str(ROOT / "deploy" / "celery-worker.sh")]
    assert spec.commands["redis"] == ["bash", str(ROOT / "deploy" / "redis-server.sh")]
    assert spec.envs["redis"]["REDIS_PASSWORD"] == spec.dotenv["REDIS_PASSWORD"]
    from peers.redis_server import RedisServer

    loopback = RedisServer(None, tmp_path / "r", "pw", port=16379).argv(spec.commands["redis"])
    assert loopback[: len(spec.commands["redis"])] == spec.commands["redis"]  # compose's command, then loopback's flags


def test_worker_script_refuses_the_local_executor_and_reads_the_queues(tmp_path):
    script = ROOT / "deploy" / "celery-worker.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "AIRFLOW__CELERY__BROKER_URL": "redis://:secret@redis:6379/0"}
    done = subprocess.run(
        ["bash", str(script)],
        env={**base, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "MLM_EXECUTOR=CeleryExecutor" in done.stderr
    # A stand-in `airflow` on PATH shows the command line the worker would run.
    (tmp_path / "airflow").write_text('#!/bin/sh\necho "$@"\n')
    (tmp_path / "airflow").chmod(0o755)
    celery = {**base, "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}
    for env, queues in (
        ({}, "cpu,control"),
        ({"MLM_CPU_QUEUE": "heavy", "MLM_CONTROL_QUEUE": "light"}, "heavy,light"),
        ({"MLM_WORKER_QUEUES": "control"}, "control"),
    ):
        done = subprocess.run(
            ["bash", str(script), "--celery-hostname", "w1"],
            env={**celery, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.stdout.splitlines()[-1] == f"celery worker --queues {queues} --celery-hostname w1", done
    for broker in ("redis://:change-me@redis:6379/0", "redis://redis:6379/0", ""):
        done = subprocess.run(
            ["bash", str(script)],
            env={**celery, "AIRFLOW__CELERY__BROKER_URL": broker},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 1 and "REDIS_PASSWORD" in done.stderr, broker


def test_env_example_documents_executor_and_queues():
    example = read_env_file(ROOT / ".env.example")
    assert example["MLM_EXECUTOR"] == "LocalExecutor"
    assert (example["MLM_CPU_QUEUE"], example["MLM_CONTROL_QUEUE"]) == ("cpu", "control")
    for key in (
        "MLM_WORKER_QUEUES",
        "MLM_SHARED_OUTPUT_ROOTS",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY",
        "COMPOSE_PROFILES",
    ):
        assert key in example, key


def test_ci_installs_redis_and_the_lock_has_the_celery_provider():
    assert "redis-server" in re.search(r"apt_packages=\(([^)]*)\)", (ROOT / ".ci" / "run").read_text()).group(1).split()
    lock = (ROOT / "requirements.txt").read_text().lower()
    for package in ("apache-airflow-providers-celery==", "celery==", "redis=="):
        assert re.search(rf"^{re.escape(package)}", lock, re.M), package


def test_every_service_reads_the_deployment_file_and_it_bounds_runs(compose, monkeypatch):
    """The compose stack's deployment file (deploy/deployment.yaml, docs/security.md) is the
    one every service reads; with .env.example's values it owns the project and connections, and keeps
    runs inside the mlm-data volume and the MLM_GCS_ROOT prefix."""
    from mlm_tasks.config.deployment import Deployment
    from mlm_tasks.errors import ConfigError

    dotenv = read_env_file(ROOT / ".env.example")
    # Every service that parses DAGs or runs tasks (validate runs in the scheduler or a worker).
    for name in ("airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-worker"):
        env = compose["services"][name]["environment"]
        assert env["MLM_DEPLOYMENT"] == "/opt/airflow/deploy/deployment.yaml", name
        # mounted read-only over the image's copy: task code, which runs in these, cannot change it
        assert "./deploy/deployment.yaml:/opt/airflow/deploy/deployment.yaml:ro" in compose["services"][name]["volumes"]
    for key, value in {
        **dotenv,
        "MLM_GCP_CONN_ID": "google_cloud_default",
        "MLM_TPU_PROJECT": "team-project",
        "MLM_GCS_ROOT": "gs://team-bucket/mlm",
        "MLM_SHARED_OUTPUT_ROOTS": "",
    }.items():
        monkeypatch.setenv(key, value)
    dep = Deployment.load(str(ROOT / "deploy" / "deployment.yaml"))
    assert dep.settings["tpu"]["project"] == "team-project" and "tpu.api_endpoint" in dep.owned_keys()
    # The release policy is the deployment's: approval by the listed approver, a private repo, the baselines
    assert {"publish.require_approval", "publish.private", "publish.releases_root"} <= set(dep.owned_keys())
    assert [(a.id, a.name) for a in dep.approvers] == [("1", "admin")] and dep.foreign_events == "refuse"
    assert dep.output_roots == ["/opt/airflow/out", "gs://team-bucket/mlm"]
    with pytest.raises(ConfigError, match="outside the roots this deployment allows"):
        dep.check_allowed(
            dep.run_config({"output_root": "/opt/airflow/out"}).model_copy(
                update={"output_root": "gs://someone-else/x"}
            )
        )
    monkeypatch.setenv("MLM_GCS_ROOT", "")  # unset in .env: no bucket at all, never "any folder"
    monkeypatch.setenv("MLM_SHARED_OUTPUT_ROOTS", "/mnt/a:/mnt/b")  # the declared shared mounts may be written
    assert Deployment.load(str(ROOT / "deploy" / "deployment.yaml")).output_roots == [
        "/opt/airflow/out",
        "/mnt/a",
        "/mnt/b",
    ]
