"""The Airflow connections a task reads, turned into arguments for `mlm_tasks` (never the environment, a log,
XCom or a file): GCP credentials, the Hub's token and endpoint, the login to a TPU VM worker.

    install_for(cfg)                                  # a task: TPU API, gcsfs and storage use the connection
    with use_connection("google_cloud_default"): ...  # a block (a trigger poll, the janitor)
    token, endpoint = hub_credentials(cfg.publish.hf_conn_id)
    connect = ssh_connect("tpu_ssh", 22, node=name, published=tpu.published_keys(cfg.tpu, name, api=api))
"""

from __future__ import annotations

import contextlib
import getpass
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mlm_tasks import credentials, storage
from mlm_tasks.tpu import ssh

if TYPE_CHECKING:
    from mlm_tasks.config import PipelineConfig

log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()  # (connection, host) already warned about in this process

# Connection extras that make the hook use something other than google.auth.default().
KEY_FIELDS = (
    "key_path",
    "keyfile_dict",
    "key_secret_name",
    "credential_config_file",
    "idp_issuer_url",
    "is_anonymous",
    "impersonation_chain",
)


def connection_credentials(conn_id: str) -> tuple[Any | None, str | None]:
    """(credentials, project) of connection `conn_id`; (None, None) when it has none of its own (ADC)."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook = GoogleBaseHook(gcp_conn_id=conn_id)
    except AirflowNotFoundException:
        log.warning(
            "No Airflow connection %r: Google clients use Application Default Credentials. Add the "
            "connection (a service-account key) to use it instead.",
            conn_id,
        )
        return None, None
    if not any(hook._get_field(f, None) for f in KEY_FIELDS):
        log.warning(
            "Airflow connection %r holds no key or other credentials: Google clients use Application "
            "Default Credentials.",
            conn_id,
        )
        return None, None
    creds, project = hook.get_credentials_and_project_id()
    log.info("Google clients use the credentials of Airflow connection %r (%s).", conn_id, type(creds).__name__)
    return creds, project or None


def install_for(cfg: PipelineConfig) -> None:
    """For the rest of this task's process, when the run touches Google Cloud: every Google client uses the
    run's connection, TensorFlow's gs:// included; storage calls get the run's deadline (storage.timeout_s)."""
    storage.set_timeout(cfg.storage.timeout_s)
    if storage.scheme(cfg.output_root) == "gs" or cfg.compute == "tpu_vm":
        creds, project = connection_credentials(cfg.gcp_conn_id)
        credentials.install(creds, project, source=f"Airflow connection {cfg.gcp_conn_id!r}")
        credentials.share_with_tensorflow(creds)


@contextlib.contextmanager
def use_connection(conn_id: str) -> Iterator[None]:
    creds, project = connection_credentials(conn_id)
    with credentials.use(creds, project, source=f"Airflow connection {conn_id!r}"):
        yield


def hub_credentials(conn_id: str) -> tuple[str, str | None]:
    """Token (connection password) and optional endpoint (connection host) of the Hub connection."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSecretsBackendAccessDenied

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise AirflowFailException(
            f"No Airflow connection {conn_id!r}: create it with the Hub token as "
            "password (see docs/releases.md). If it exists, a secrets backend failed to "
            "answer (the task log says so at debug level): clear the task."
        ) from None
    except AirflowSecretsBackendAccessDenied as err:  # an authoritative deny: a retry gets the same answer
        raise AirflowFailException(
            f"Airflow connection {conn_id!r} may not be read by this task ({err}): grant "
            "the DAG access to it, or set publish.hf_conn_id to one it may read."
        ) from None
    if not conn.password:
        raise AirflowFailException(f"Airflow connection {conn_id!r} has no password: put the Hub token there.")
    return conn.password, (conn.host or None)


def ssh_connect(
    conn_id: str,
    port: int,
    patience_s: float = 300.0,
    *,
    node: str = "",
    published: ssh.Published | None = None,
    poll_s: float = 5.0,
) -> ssh.Connect:
    """connect(host, worker=0) -> logged-in paramiko SSHClient, as connection `conn_id`."""
    from airflow.providers.ssh.hooks.ssh import SSHHook

    def login_for(host: str) -> ssh.Login:
        hook = SSHHook(ssh_conn_id=conn_id, remote_host=host, port=port, conn_timeout=30)
        options: dict[str, Any] = {
            "password": hook.password or None,
            "pkey": hook.pkey,
            "key_filename": hook.key_file,
            "look_for_keys": hook.look_for_keys,
            "timeout": hook.conn_timeout,
            "banner_timeout": hook.banner_timeout,
            "auth_timeout": hook.auth_timeout,
            "compress": hook.compress,
            "sock": hook.host_proxy,
            "disabled_algorithms": hook.disabled_algorithms,
        }
        found = ssh.Login(
            hook.username or getpass.getuser(),  # SSHHook falls back to it already; its attribute is Optional
            f"connection {conn_id!r}",
            options,
            keepalive_s=hook.keepalive_interval or 0,
            no_host_key_check=bool(hook.no_host_key_check),
        )
        if found.no_host_key_check and (conn_id, host) not in _warned:
            _warned.add((conn_id, host))  # once: a trigger polling every 30 s would repeat it in every poll
            log.warning(
                "Connection %r sets no_host_key_check=true: the host key of %s is not checked, so any "
                "machine answering there is trusted. Remove it to pin the keys node %s published.",
                *(conn_id, host, node or "(unknown)"),
            )
        return found

    return ssh.connector(login_for, port, node=node, published=published, patience_s=patience_s, poll_s=poll_s)
