"""plugins/mlm_airflow/connections.py: a task's Google clients get the credentials of the run's Airflow GCP
connection, read by the Google provider's own hook; ADC only where the connection has none (logged)."""

import json
import os

from mlm_tasks import credentials, storage
from mlm_tasks.config import build_config
from mlm_tasks.paths import join


def test_install_for_a_gs_run_hands_the_connections_key_to_gcsfs(gcs_root, oauth_server, monkeypatch):
    from mlm_airflow.connections import install_for

    key = oauth_server.new_service_account("conn@mlm-test-project.iam.gserviceaccount.com")
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLM_GCP",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(key)}}),
    )
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "restored-after-the-test")
    cfg = build_config({"output_root": gcs_root, "gcp_conn_id": "mlm_gcp"})
    assert cfg.sensor.gcp_conn_id == "mlm_gcp"  # the sensor follows the one connection setting
    try:
        install_for(cfg)
        handed = credentials.handed()
        assert handed.credentials.service_account_email == key["client_email"]
        assert handed.project == key["project_id"] and "mlm_gcp" in handed.source
        assert storage.filesystem(gcs_root).credentials.credentials is handed.credentials
        storage.write_text(join(gcs_root, "via-connection.txt"), "ok")
        assert key["client_email"] in oauth_server.grants  # the key was really used (JWT grant)
        # TensorFlow's gs:// reads this variable: an access token the token endpoint issued for the key.
        token = os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"]
        assert oauth_server.tokens[token]["email"] == key["client_email"]
    finally:
        credentials.install(None)
        credentials.stop_sharing_with_tensorflow()


def test_a_local_run_hands_nothing(monkeypatch):
    from mlm_airflow.connections import install_for

    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    install_for(build_config({"output_root": "/tmp/x"}))
    assert credentials.handed() is None
