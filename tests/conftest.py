"""Shared pytest fixtures. Peers (fake servers, emulators) live in tests/peers/, one module each.

gcs         session   gcp-storage-emulator on a free loopback port; sets STORAGE_EMULATOR_HOST
gcs_root    function  a fresh gs://<bucket>/<prefix> on that emulator
tf_gcs_env  session   env for a TensorFlow subprocess whose gs:// I/O lands in the emulator
fake_hub    function  a fake Hugging Face Hub API on loopback; huggingface_hub points at it
fake_tpu    function  a fake Cloud TPU v2 REST API on loopback (FakeTpuApi; .url for api_endpoint) that
                      takes only tokens of the OAuth peer; google_cloud_default holds sa_key
oauth_server session  a loopback OAuth2 token endpoint (peers.oauth_token); sa_key: a key for it
sshd        session   a real OpenSSH server on loopback: (host, port, user, private_key_path)
airflow_env session   env of a migrated SQLite Airflow in a temp AIRFLOW_HOME (peers.airflow_home.dags_test)
pt_python   session   python of the PyTorch + transformers 5.x env (.venv-pt/, `make env-pt`)
tiny_model  session   (cfg, run) of a tiny model trained and saved by the real train step
tiny_modernbert session (cfg, run, summary): the same for model.architecture=modernbert
"""

import os
import sys
import tempfile

# Tests import `mlm_tasks` from the repo root and peers from tests/, however pytest was started
# (`pytest`, `python -m pytest`, from another directory).
_TESTS = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_TESTS)
for _path in (_REPO, _TESTS):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# Airflow writes its config and logs under AIRFLOW_HOME on first import: keep that out of ~/airflow.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-home-")
# A CPU run's MFU peak is measured once per machine kind and cached: the tests' own cache, not the user's.
os.environ.setdefault(
    "MLM_CPU_PEAK_CACHE", os.path.join(tempfile.gettempdir(), f"mlm-tests-cpu-peak-{os.getuid()}.json")
)
# The fake TPU API answers 429 then 503 before each create/delete goes through: retry those fast.
os.environ.setdefault("MLM_TPU_RETRY_INITIAL_S", "0.05")

from peers.fake_hub import fake_hub  # noqa: E402,F401  (fixture)
from peers.gcs import gcs, gcs_root  # noqa: E402,F401  (fixtures)
from peers.tls_proxy import tf_gcs_env, tls_gcs_proxy  # noqa: E402,F401  (fixtures)

# Airflow puts plugins/ itself on sys.path; DAGs and plugin modules import each other that way.
_PLUGINS = os.path.join(os.path.dirname(_TESTS), "plugins")
if _PLUGINS not in sys.path:
    sys.path.append(_PLUGINS)
import pytest  # noqa: E402

from peers.airflow_home import airflow_env  # noqa: E402,F401  (fixture)
from peers.fake_tpu_api import fake_tpu, oauth_server, sa_key  # noqa: E402,F401  (fixtures)
from peers.model_clients import pt_python, tiny_model, tiny_modernbert  # noqa: E402,F401  (fixtures)
from peers.sshd import sshd  # noqa: E402,F401  (fixture)
from peers.tiny_data import tiny_cfg, tiny_prepared  # noqa: E402,F401  (fixtures)


@pytest.fixture(autouse=True)
def _no_credentials_left_behind():
    """Credentials handed to mlm_tasks are process-wide (as in a task): never let one test's reach the
    next (a test of "no credentials" would otherwise pass or fail by test order)."""
    yield
    from mlm_tasks import credentials

    if credentials.current() is not None:
        credentials.install(None)
        credentials.stop_sharing_with_tensorflow()


@pytest.fixture(autouse=True)
def _storage_deadline_restored():
    """storage.set_timeout is process-wide (as in a task): a test that shortens it must not shorten the next's."""
    yield
    from mlm_tasks import storage

    storage.set_timeout(storage.DEFAULT_TIMEOUT_S)


# Test kinds, by where a test lives and what it needs (`make test-fast` runs `-m unit`):
#   deploy  tests/deploy/: the compose stack's services (PostgreSQL, Redis, Celery, a browser)
#   e2e     a real Airflow (migrated DB, `airflow dags test`), the PyTorch env, the simulated TPU VM image,
#           TensorFlow's own gs:// through the TLS proxy (a TensorFlow subprocess)
#   slow    marked by hand (trains a model, runs Airflow end to end, resolves locks against the index), or
#           needs a fixture that takes long to build (_SLOW_FIXTURES)
#   unit    everything else: seconds each, on this machine's CPU and loopback peers
_E2E_FIXTURES = {
    "airflow_env",
    "airflow_stack",
    "airflow_api",
    "pt_python",
    "tiny_model",
    "tiny_modernbert",
    "tpu_vm_python",
    "tf_gcs_env",
    "tls_gcs_proxy",
}
_SLOW_FIXTURES = {"seed_shards"}  # the seed's own script writes them (datasets.map pipeline): ~15 s to build
_E2E_FILES = {
    "test_simulated_tpu_vm.py",  # builds the simulated TPU VM image (tests/peers/tpu_vm_image.py)
    "test_train_job.py",
}  # detached trainers killed, frozen and left stale over sshd: ~1 min


def _suffix_xdist_groups(config, items):
    """`--dist loadgroup` schedules by a `@<group>` suffix of each nodeid, which pytest-xdist 3.8 adds by
    setting `item._nodeid`; pytest 9 reads the nodeid from `item._id`, so that suffix never appears and
    the groups are ignored (a shared stack then starts on every worker). Add it the way pytest 9 keeps it."""
    if not config.getoption("loadgroup", default=False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


SLOW_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    deploy = os.path.join(_TESTS, "deploy") + os.sep
    for item in items:
        path = str(item.path)
        kinds = set()
        if path.startswith(deploy):
            kinds.add("deploy")
        fixtures = set(getattr(item, "fixturenames", ()))
        if _E2E_FIXTURES & fixtures or os.path.basename(path) in _E2E_FILES:
            kinds.add("e2e")
        if _SLOW_FIXTURES & fixtures and item.get_closest_marker("slow") is None:
            item.add_marker("slow")
        if not kinds and item.get_closest_marker("slow") is None:
            kinds.add("unit")
        for kind in sorted(kinds):
            item.add_marker(kind)
        # pytest-timeout: 300 s (pyproject) for a test, 900 s for a slow or end-to-end one without a mark of its
        # own (a DAG run end to end took 197 s alone and over 300 s beside two other workers on 2 cores).
        slow = kinds & {"e2e", "deploy"} or item.get_closest_marker("slow")
        if slow and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        # pytest-xdist (`--dist loadgroup`): tests that share an expensive stack run on one worker, so it is
        # built once: the session's Airflow stack, and each module's own stacks and sshd-backed VMs.
        if "airflow_stack" in fixtures:
            item.add_marker(pytest.mark.xdist_group("airflow_stack"))
        elif kinds & {"deploy", "e2e"}:
            item.add_marker(pytest.mark.xdist_group(os.path.basename(path)))
    _suffix_xdist_groups(config, items)
