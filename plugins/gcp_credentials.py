"""The credentials of the run's Airflow GCP connection, handed to every Google client of a task.

    from gcp_credentials import connection_credentials, install_for
    install_for(cfg)                                  # a task: TPU API, gcsfs and storage use the connection
    with use_connection("google_cloud_default"): ...  # a block (a trigger poll, the janitor)

The Google provider's own hook (`GoogleBaseHook.get_credentials_and_project_id`) reads the
connection, so every form it supports works (and TensorFlow's gs:// gets the same identity as a
refreshed access token, see `mlm_tasks.credentials.share_with_tensorflow`): a key JSON (`keyfile_dict`), a key file
(`key_path`),
a secret, workload identity federation, impersonation, anonymous. `mlm_tasks.credentials` carries
the google-auth object to the clients (mlm_tasks never imports Airflow). Only where the connection
does not exist or holds no credentials of its own do the clients fall back to Application Default
Credentials, and the log says so.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mlm_tasks import credentials, storage

if TYPE_CHECKING:
    from mlm_tasks.config import PipelineConfig

log = logging.getLogger(__name__)

# Connection extras that make the hook use something other than google.auth.default().
KEY_FIELDS = ("key_path", "keyfile_dict", "key_secret_name", "credential_config_file", "idp_issuer_url",
              "is_anonymous", "impersonation_chain")


def connection_credentials(conn_id: str) -> tuple[Any | None, str | None]:
    """(credentials, project) of connection `conn_id`; (None, None) when it has none of its own (ADC)."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook = GoogleBaseHook(gcp_conn_id=conn_id)
    except AirflowNotFoundException:
        log.warning("No Airflow connection %r: Google clients use Application Default Credentials. Add the "
                    "connection (a service-account key) to use it instead.", conn_id)
        return None, None
    if not any(hook._get_field(f, None) for f in KEY_FIELDS):
        log.warning("Airflow connection %r holds no key or other credentials: Google clients use Application "
                    "Default Credentials.", conn_id)
        return None, None
    creds, project = hook.get_credentials_and_project_id()
    log.info("Google clients use the credentials of Airflow connection %r (%s).", conn_id, type(creds).__name__)
    return creds, project or None


def install(conn_id: str) -> None:
    """For the rest of this task's process: every Google client uses connection `conn_id`, TensorFlow's
    own gs:// filesystem included (through a refreshed access token)."""
    creds, project = connection_credentials(conn_id)
    credentials.install(creds, project, source=f"Airflow connection {conn_id!r}")
    credentials.share_with_tensorflow(creds)


def install_for(cfg: PipelineConfig) -> None:
    """A task's Google clients use the run's connection, when the run touches Google Cloud at all; its
    storage calls get the run's deadline (storage.timeout_s)."""
    storage.set_timeout(cfg.storage.timeout_s)
    if cfg.output_root.startswith("gs://") or cfg.compute == "tpu_vm":
        install(cfg.gcp_conn_id)


@contextlib.contextmanager
def use_connection(conn_id: str) -> Iterator[None]:
    creds, project = connection_credentials(conn_id)
    with credentials.use(creds, project, source=f"Airflow connection {conn_id!r}"):
        yield
