"""mlm_tasks.credentials: the Google clients of mlm_tasks (gcsfs, google-cloud-storage) use what was
handed in. The GCS emulator checks no token, so these tests assert which credentials object each client
holds and that the key really went through the loopback OAuth peer (a JWT grant signed by it)."""

import subprocess
import sys
from pathlib import Path

from google.oauth2 import service_account

from mlm_tasks import credentials, storage
from mlm_tasks.paths import join

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def _creds(key: dict):
    return service_account.Credentials.from_service_account_info(key, scopes=[SCOPE])


def test_gcsfs_and_storage_client_use_the_handed_credentials(gcs_root, oauth_server):
    key = oauth_server.new_service_account("storage-test@mlm-test-project.iam.gserviceaccount.com")
    creds = _creds(key)
    with credentials.use(creds, key["project_id"], "test"):
        fs = storage.filesystem(gcs_root)
        assert fs.credentials.credentials is creds  # gcsfs holds exactly this object
        storage.write_text(join(gcs_root, "a.txt"), "hello")
        assert storage.read_text(join(gcs_root, "a.txt")) == "hello"
        client = storage._gcs_client()
        assert client._credentials is creds and client.project == key["project_id"]
        assert storage.create_only(join(gcs_root, "b.txt"), b"x")
    # gcsfs refreshed the key at the token endpoint the key names: a verified JWT grant for this account.
    assert key["client_email"] in oauth_server.grants
    # Nothing handed in: the emulator's anonymous access, as before.
    assert credentials.current() is None or credentials.current() is not creds
    assert not storage.filesystem(gcs_root).exists(join(gcs_root, "c.txt"))


def test_install_is_process_wide_and_use_wins_inside_its_block(oauth_server):
    a = _creds(oauth_server.new_service_account("a@mlm-test-project.iam.gserviceaccount.com"))
    b = _creds(oauth_server.new_service_account("b@mlm-test-project.iam.gserviceaccount.com"))
    try:
        credentials.install(a, "p")
        assert credentials.current() is a
        with credentials.use(b):
            assert credentials.current() is b
        assert credentials.current() is a
    finally:
        credentials.install(None)
    assert credentials.current() is None


def test_validate_takes_handed_credentials_as_credentials(oauth_server, monkeypatch, tmp_path):
    from mlm_tasks.credentials import check_gcs_credentials

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with credentials.use(_creds(oauth_server.new_service_account("v@mlm-test-project.iam.gserviceaccount.com"))):
        check_gcs_credentials("gs://bucket/prefix")  # no ADC needed: the connection's key counts


def test_mlm_tasks_credentials_imports_no_airflow():
    code = "import mlm_tasks.credentials, mlm_tasks.storage, sys; assert 'airflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).parents[2]))
