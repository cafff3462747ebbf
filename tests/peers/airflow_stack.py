"""The docker-compose stack as real local processes: PostgreSQL, api-server, scheduler, dag-processor, triggerer.

    with running_stack(workdir) as stack:          # or the `airflow_stack` fixture (session)
        stack.token                                 # JWT for the REST API (POST /auth/token)
        httpx.get(stack.url + "/api/v2/dags", headers=stack.headers)

    with running_stack(workdir, executor="CeleryExecutor") as stack:   # the compose `celery` profile
        stack.start_worker("worker-a", queues="cpu,control")           # + a real redis-server
        stack.kill("worker-a"); stack.redis.stop(); stack.restart("airflow-scheduler")

Nothing here is a second description of the deployment: `stack_spec()` reads docker-compose.yaml
(each service's command and its own environment: no service gets the whole .env) and .env.example
(the keys an operator sets), and only rewrites what must differ on loopback — container paths become
local folders (bind mounts → the repo, named volumes → temp folders), the peers' addresses in URLs
(`postgres`, `redis`) become 127.0.0.1 and free ports, the api-server listens on 127.0.0.1 on a free
port, and secrets are generated. tests/deploy/test_compose.py checks exactly that list. PostgreSQL
comes from Debian's packages (`apt-get install postgresql`), and checks passwords on TCP
(scram-sha-256) as the postgres image does. With the CeleryExecutor, Redis is Debian's `redis-server`
on a free port, started by the compose service's own script (peers/redis_server.py), and each worker
gets the flags several workers on one machine need (`--celery-hostname`, no log server port of its
own, a hostname of its own for the task instances: WORKER_LOCAL_ENV).

Users of the FAB auth manager besides `admin` (e.g. a Viewer) are made with the deployment's own
deploy/fab-user.py: `running_stack(workdir, users={"viewer": "Viewer"})`, then `stack.token_for("viewer")`.

Every process runs in its own process group with a marker in its environment; shutdown stops the
groups (SIGTERM, then SIGKILL), checks the ports are free again and that no process anywhere still
carries the marker.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
INIT_SERVICE = "airflow-init"
SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
CELERY_SERVICES = ("redis", "airflow-worker")  # profile `celery`
FLOWER = "airflow-flower"  # profile `flower`: not part of running_stack; tests/deploy/test_flower.py runs it
CONTAINER_HOME = "/opt/airflow"  # AIRFLOW_HOME and WORKDIR of the Dockerfile
ADMIN_USER = "admin"
# The environment keys the harness sets itself, and why; every other key is the compose file's.
LOCAL_KEYS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "the loopback PostgreSQL (host and port only)",
    "AIRFLOW__API__HOST": "listen on loopback only",
    "AIRFLOW__API__PORT": "a free port instead of 8080",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "the api-server on that port",
    "AIRFLOW__CELERY__BROKER_URL": "the loopback redis-server (host and port only)",
    "AIRFLOW__CELERY__RESULT_BACKEND": "the loopback PostgreSQL (host and port only)",
}
# What each Celery worker sets besides, and why: on one machine they share a hostname and port 8793.
WORKER_LOCAL_ENV = {
    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "peers.worker_hostname.hostname",  # task instances record the
    # worker's name (MLM_TEST_WORKER_HOSTNAME), as distinct machines record their own hostnames
}
# --celery-hostname: unique Celery node names; --skip-serve-logs: one log server port (8793) per
# machine, and the api-server reads these workers' logs from the shared log folder instead.
WORKER_LOCAL_ARGS = ("--celery-hostname", "--concurrency", "--skip-serve-logs")
GENERATED = (
    "POSTGRES_PASSWORD",
    "POSTGRES_SUPERUSER_PASSWORD",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "REDIS_PASSWORD",
    "CELERY_RESULT_DB_PASSWORD",
    "FLOWER_PASSWORD",
)
MARKER = "MLM_TEST_STACK_ID"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as docker compose reads an env_file (comments and blank lines skipped)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def path_map(service: dict, home: Path) -> list[tuple[str, str]]:
    """Container path → local path, longest first: bind mounts → repo, named volumes → `home/<name>`,
    the rest of /opt/airflow → the repo (the Dockerfile copies dags/ plugins/ configs/ deploy/ there),
    and AIRFLOW_HOME itself (airflow.cfg) → `home`."""
    pairs = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        local = ROOT / source if source.startswith(".") else home / source
        pairs.append((target, str(local.resolve() if source.startswith(".") else local)))
    pairs += [(f"{CONTAINER_HOME}/{sub}", str(ROOT / sub)) for sub in ("deploy",)]
    pairs.append((CONTAINER_HOME, str(home)))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR:?error} from `variables` (.env), and $$ → $."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        value = variables.get(name, "")
        if op == ":?" and not value:
            raise RuntimeError(f"{name} is not set: {arg}")
        return value if value or op != ":-" else arg

    return re.sub(r"\$\$|\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def translate(value: str, pairs: list[tuple[str, str]]) -> str:
    for container, local in pairs:
        if value == container or value.startswith(container + "/"):
            return local + value[len(container) :]
    return value


def on_loopback(url: str, port: int) -> str:
    """`url` with its host (a compose service name) replaced by 127.0.0.1:`port`; user, password and
    path kept, so the loopback peer checks the same credentials."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


@dataclass
class StackSpec:
    envs: dict[str, dict[str, str]]  # service → its process environment (compose's, on loopback)
    dotenv: dict[str, str]  # the .env compose interpolates ${...} from (.env.example + generated secrets)
    commands: dict[str, list[str]]  # service → argv, init first (and the celery profile's services)
    port: int
    home: Path
    redis_port: int = 0


def stack_spec(
    home: Path,
    pg_port: int,
    port: int,
    *,
    compose: dict | None = None,
    variables: dict[str, str] | None = None,
    redis_port: int = 0,
) -> StackSpec:
    """What docker compose would run, as local argv + one environment per service (see the module
    docstring). `variables` are set in .env for compose's interpolation (e.g. MLM_EXECUTOR=CeleryExecutor)."""
    compose = compose or load_compose()
    services = compose["services"]
    redis_port = redis_port or free_port()
    dotenv = dict(read_env_file(ENV_EXAMPLE))
    dotenv.update({key: generated_secret(key) for key in GENERATED})
    dotenv.update(variables or {})
    bin_dir = str(Path(sys.executable).parent)  # `airflow`, `python` of this venv, as PATH does in the image
    local = {
        "AIRFLOW__API__HOST": lambda _: "127.0.0.1",
        "AIRFLOW__API__PORT": lambda _: str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": lambda _: f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": lambda url: on_loopback(url, pg_port),
        "AIRFLOW__CELERY__RESULT_BACKEND": lambda url: on_loopback(url, pg_port),
        "AIRFLOW__CELERY__BROKER_URL": lambda url: on_loopback(url, redis_port),
    }
    assert set(local) == set(LOCAL_KEYS)
    envs, commands = {}, {}
    for name in (INIT_SERVICE, *SERVICES, *CELERY_SERVICES, FLOWER):
        service = services[name]
        pairs = path_map(service, home)
        env = {"AIRFLOW_HOME": str(home), "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
        for key, value in (service.get("environment") or {}).items():
            value = translate(interpolate(str(value), dotenv), pairs)
            env[key] = local[key](value) if key in local else value
        if "MLM_DEPLOYMENT" in env:  # the file names container paths too: the same map, into a copy
            env["MLM_DEPLOYMENT"] = str(_local_deployment_file(Path(env["MLM_DEPLOYMENT"]), pairs, home, name))
        envs[name] = env
        argv = [translate(interpolate(arg, dotenv), pairs) for arg in service["command"]]
        if argv[0] in ("airflow", "python"):
            argv[0] = os.path.join(bin_dir, argv[0])
        commands[name] = argv
    return StackSpec(envs=envs, dotenv=dotenv, commands=commands, port=port, home=home, redis_port=redis_port)


def _local_deployment_file(path: Path, pairs: list[tuple[str, str]], home: Path, service: str) -> Path:
    """deploy/deployment.yaml with its container paths (/opt/airflow/out, /opt/airflow/configs) mapped
    as this service's volumes map them."""
    text = path.read_text()
    for container, local_path in pairs:
        text = re.sub(re.escape(container) + r"(?=[/\],\s]|$)", local_path, text, flags=re.M)
    # Beside home, not in it: callers may create home after the spec (stack_spec only describes).
    copy = home.parent / f"{home.name}-deployment-{service}.yaml"
    copy.write_text(text)
    return copy


def data_volume(stack: Stack) -> Path:
    """The stack's `mlm-data` volume (/opt/airflow/out): the deployment file lets runs write there."""
    return stack.spec.home / "mlm-data"


def generated_secret(key: str) -> str:
    if key == "AIRFLOW__CORE__FERNET_KEY":
        from cryptography.fernet import Fernet

        return Fernet.generate_key().decode()
    return secrets.token_hex(24)


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Procs:
    marker: str
    logs: Path
    running: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115  (the child's stdout for its whole life)
        proc = subprocess.Popen(
            argv,
            env={**env, MARKER: self.marker},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **kwargs,
        )
        log.close()
        self.running[name] = proc
        return proc

    def check_alive(self) -> None:
        for name, proc in self.running.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log:\n{self.tail(name)}")

    def tail(self, name: str, chars: int = 6000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def stop_all(self, timeout: float = 30) -> None:
        # Airflow components first (they hold database connections), PostgreSQL last.
        for name in reversed(list(self.running)):
            stop_group(self.running[name], timeout, sig=signal.SIGINT if name == "postgres" else signal.SIGTERM)

    def leftovers(self) -> list[str]:
        """Processes anywhere on the machine that still carry this stack's marker."""
        found = []
        needle = f"{MARKER}={self.marker}".encode()
        for environ in glob.glob("/proc/[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if needle in Path(environ).read_bytes():
                    pid = environ.split("/")[2]
                    with contextlib.suppress(OSError):
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                        found.append(f"{pid}: {cmdline}")
        return found


def stop_group(proc: subprocess.Popen, timeout: float, sig: int = signal.SIGTERM) -> None:
    """Stop the process and everything it started (its process group): `sig`, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _group_alive(proc):
        time.sleep(0.2)
    if _group_alive(proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the leader, else it lingers as a zombie member of its group
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    # Zombies still count for killpg; they are dead, so look at their state.
    return any(_state(pid) not in ("Z", None) for pid in _group_pids(proc.pid))


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                pids.append(int(stat.split("/")[2]))
    return pids


def descendants(pid: int) -> list[int]:
    """Every process started (transitively) by `pid`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


# --- PostgreSQL -----------------------------------------------------------------------------------


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    if shutil.which(name):
        return shutil.which(name)
    raise RuntimeError(f"PostgreSQL's {name} not found: apt-get install -y postgresql")


def start_postgres(procs: Procs, workdir: Path, port: int, password: str) -> None:
    """initdb + postgres on 127.0.0.1:port (as the `postgres` user when we are root), superuser `postgres`
    with `password`, checked on TCP (scram-sha-256, as the postgres image does; the Unix socket is
    trusted, as there). Nothing else: airflow-init makes Airflow's role and database (deploy/metadata-db.py),
    as in the compose stack."""
    as_user = {}
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        shutil.chown(workdir, "postgres", "postgres")
    data, sockets = workdir / "data", workdir / "sock"
    pwfile = workdir / "pwfile"
    pwfile.write_text(password + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres", "postgres")
    pwfile.chmod(0o600)
    init = subprocess.run(
        [
            pg_bin("initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        **as_user,
    )
    pwfile.unlink()
    if init.returncode:
        raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
    sockets.mkdir()
    if as_user:
        shutil.chown(sockets, "postgres", "postgres")
    procs.start(
        "postgres",
        [
            pg_bin("postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(sockets),
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ],
        dict(os.environ),
        **as_user,
    )
    deadline = time.monotonic() + 60
    while True:
        ready = subprocess.run([pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
        if ready.returncode == 0:
            break
        procs.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL did not accept connections:\n{procs.tail('postgres')}")
        time.sleep(0.3)


# --- the stack ------------------------------------------------------------------------------------


@dataclass
class Stack:
    url: str
    token: str
    spec: StackSpec
    procs: Procs
    redis: object | None = None  # peers.redis_server.RedisServer with the CeleryExecutor
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # username → (role, password), admin's too

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def password(self) -> str:
        return self.spec.dotenv["AIRFLOW_ADMIN_PASSWORD"]

    def env_of(self, name: str) -> dict[str, str]:
        """The environment `name` (a service, or a worker of start_worker) was started with."""
        return self._commands[name][1] if name in self._commands else self.spec.envs[name]

    def token_for(self, username: str) -> str:
        """A JWT for `username`, from POST /auth/token as an operator's script gets one."""
        return get_token(self.url, self.users[username][1], username)

    def start_worker(
        self,
        name: str,
        queues: str,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        timeout: float = 180,
        cpus: str | None = None,
    ) -> subprocess.Popen:
        """The compose `airflow-worker` service as process `name` (its Celery hostname and the hostname
        its task instances record), consuming `queues`, held to `cpus` (taskset list) when given;
        returns once Celery reports it ready."""
        argv = [
            *self.spec.commands["airflow-worker"],
            "--celery-hostname",
            name,
            "--concurrency",
            str(concurrency),
            "--skip-serve-logs",
        ]  # WORKER_LOCAL_ARGS
        if cpus is not None:
            argv = ["taskset", "-c", cpus, *argv]
        base = self.spec.envs["airflow-worker"]
        # tests/ for peers.worker_hostname, after the repo root: tests/mlm_tasks/ mirrors the package's folders
        # (tpu/, data/, ...), and as a namespace package ahead of an editable install's finder it would shadow them.
        worker_env = {
            **base,
            **WORKER_LOCAL_ENV,
            "MLM_WORKER_QUEUES": queues,
            "MLM_TEST_WORKER_HOSTNAME": name,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), base.get("PYTHONPATH", "")]),
            **(env or {}),
        }
        proc = self.procs.start(name, argv, worker_env, cwd=self.spec.home)
        self._commands[name] = (argv, worker_env)
        self.wait_for_worker(name, timeout)
        return proc

    def wait_for_worker(self, name: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while f"celery@{name} ready" not in self.procs.tail(name, 20000):
            self.procs.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} not ready after {timeout}s:\n{self.procs.tail(name)}")
            time.sleep(0.5)

    def stop(self, name: str, timeout: float = 60) -> None:
        """SIGTERM (a worker's warm shutdown: it finishes its running tasks first), then SIGKILL."""
        stop_group(self.procs.running.pop(name), timeout)

    def kill(self, name: str) -> float:
        """SIGKILL to `name` and every process under it, task processes in their own process groups
        included (no cleanup anywhere, as a machine losing power); returns when (monotonic)."""
        proc = self.procs.running.pop(name)
        tree = [proc.pid, *descendants(proc.pid)]
        killed_at = time.monotonic()
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_group(proc, timeout=10)
        return killed_at

    def restart(self, name: str) -> subprocess.Popen:
        """Start `name` again with its command and environment (a service or a worker)."""
        if name in self._commands:
            argv, env = self._commands[name]
            proc = self.procs.start(name, argv, env, cwd=self.spec.home)
            self.wait_for_worker(name)
            return proc
        return self.procs.start(name, self.spec.commands[name], self.spec.envs[name], cwd=self.spec.home)

    def __post_init__(self):
        self._commands: dict[str, tuple[list[str], dict[str, str]]] = {}


def wait_healthy(url: str, procs: Procs, timeout: float = 240) -> dict:
    """Until /api/v2/monitor/health says the scheduler, dag-processor and triggerer are healthy."""
    import httpx

    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        procs.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            last = httpx.get(f"{url}/api/v2/monitor/health", timeout=5).json()
            parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
            if all((last.get(p) or {}).get("status") == "healthy" for p in parts):
                return last
        time.sleep(1)
    logs = "\n".join(f"--- {name}\n{procs.tail(name, 2000)}" for name in procs.running)
    raise RuntimeError(f"Airflow not healthy after {timeout}s: {last}\n{logs}")


def get_token(url: str, password: str, username: str = ADMIN_USER) -> str:
    """POST /auth/token, served by the FAB auth manager (201 with {"access_token": ...})."""
    import httpx

    reply = httpx.post(f"{url}/auth/token", json={"username": username, "password": password}, timeout=30)
    reply.raise_for_status()
    return reply.json()["access_token"]


@contextlib.contextmanager
def running_stack(
    workdir: Path,
    executor: str = "LocalExecutor",
    extra_env: dict[str, str] | None = None,
    users: dict[str, str] | None = None,
    dotenv: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """PostgreSQL + airflow-init + the four Airflow services (+ redis-server with the CeleryExecutor;
    workers are started with `stack.start_worker`); everything stopped and checked on exit.
    `extra_env` is for a test's own tuning (timeouts), on top of what the compose file sets, in every
    service. `users`: username → FAB role, made after init with generated passwords (`stack.users`).
    `dotenv`: values an operator sets in .env (e.g. a connection), which compose hands only to the
    services whose environment names them."""
    # A folder outside pytest's 0700 tmp tree: the `postgres` user must reach its data directory.
    pg_dir = Path(tempfile.mkdtemp(prefix="mlm-pg-"))
    home = workdir / "airflow_home"
    home.mkdir(parents=True)
    logs = workdir / "logs"
    logs.mkdir()
    procs = Procs(marker=secrets.token_hex(8), logs=logs)
    pg_port, api_port, redis_port = free_port(), free_port(), free_port()
    redis = None
    try:
        pg_password = generated_secret("POSTGRES_PASSWORD")
        superuser_password = generated_secret("POSTGRES_SUPERUSER_PASSWORD")
        start_postgres(procs, pg_dir, pg_port, superuser_password)
        spec = stack_spec(
            home,
            pg_port,
            api_port,
            redis_port=redis_port,
            variables={
                **(dotenv or {}),
                "MLM_EXECUTOR": executor,
                "POSTGRES_PASSWORD": pg_password,
                "POSTGRES_SUPERUSER_PASSWORD": superuser_password,
            },
        )
        for env in spec.envs.values():
            env.update(extra_env or {})
        if "CeleryExecutor" in executor:
            from peers.redis_server import RedisServer

            redis = RedisServer(procs, workdir / "redis", spec.envs["redis"]["REDIS_PASSWORD"], port=redis_port)
            redis.start(spec.commands["redis"])
        init_env = {**spec.envs[INIT_SERVICE], MARKER: procs.marker}
        init = subprocess.run(
            spec.commands[INIT_SERVICE], env=init_env, capture_output=True, text=True, timeout=600, cwd=home
        )
        if init.returncode:
            raise RuntimeError(f"airflow-init failed:\n{init.stdout[-4000:]}\n{init.stderr[-4000:]}")
        accounts = {ADMIN_USER: ("Admin", spec.dotenv["AIRFLOW_ADMIN_PASSWORD"])}
        if users:
            accounts.update({name: (role, secrets.token_hex(16)) for name, role in users.items()})
            passwords = {f"MLM_USER_PASSWORD_{name.upper()}": accounts[name][1] for name in users}
            made = subprocess.run(
                [
                    os.path.join(os.path.dirname(sys.executable), "python"),
                    str(ROOT / "deploy" / "fab-user.py"),
                    *(f"{n}={r}" for n, r in users.items()),
                ],
                env={**init_env, **passwords},
                capture_output=True,
                text=True,
                timeout=600,
                cwd=home,
            )
            if made.returncode:
                raise RuntimeError(f"fab-user.py failed:\n{made.stdout[-4000:]}\n{made.stderr[-4000:]}")
        for name in SERVICES:
            procs.start(name, spec.commands[name], spec.envs[name], cwd=home)
        url = f"http://127.0.0.1:{api_port}"
        wait_healthy(url, procs)
        yield Stack(
            url=url,
            token=get_token(url, spec.dotenv["AIRFLOW_ADMIN_PASSWORD"]),
            spec=spec,
            procs=procs,
            redis=redis,
            users=accounts,
        )
    finally:
        procs.stop_all()
        shutil.rmtree(pg_dir, ignore_errors=True)
    left = procs.leftovers()
    busy = [port for port in (pg_port, api_port, redis_port) if not port_is_free(port)]
    assert not left, f"processes still running after shutdown: {left}"
    assert not busy, f"ports still bound after shutdown: {busy}"
