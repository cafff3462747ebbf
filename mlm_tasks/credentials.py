"""The Google credentials every Google client of this process uses (TPU API, gcsfs, google-cloud-storage).

credentials.install(creds, project)        # for the rest of this process (an Airflow task)
with credentials.use(creds, project): ...  # for a block (a trigger poll, a test)
credentials.current()                      # what the clients get; None -> Application Default Credentials"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Handed:
    credentials: Any  # a google.auth.credentials.Credentials
    project: str | None = None
    source: str = ""  # where they came from, for logs ("Airflow connection 'google_cloud_default'")


_process: Handed | None = None
_block: contextvars.ContextVar[Handed | None] = contextvars.ContextVar("mlm_google_credentials", default=None)


def install(creds: Any, project: str | None = None, source: str = "") -> None:
    """Use `creds` for every Google client this process makes from now on (None: back to ADC)."""
    global _process
    _process = Handed(creds, project, source) if creds is not None else None


@contextlib.contextmanager
def use(creds: Any, project: str | None = None, source: str = "") -> Iterator[None]:
    """Use `creds` inside the block (this thread and tasks it starts with copied context)."""
    token = _block.set(Handed(creds, project, source) if creds is not None else None)
    try:
        yield
    finally:
        _block.reset(token)


def handed() -> Handed | None:
    return _block.get() or _process


def current() -> Any | None:
    """The credentials handed in, or None: the client then uses Application Default Credentials."""
    got = handed()
    return got.credentials if got else None


def check_gcs_credentials(uri: str) -> None:
    """An AuthError saying how to give credentials when `uri` (gs://) would be reached with none."""
    if current() is not None or os.environ.get("STORAGE_EMULATOR_HOST"):
        return  # handed in from the Airflow connection (or an emulator that takes none)
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    from mlm_tasks.errors import AuthError

    try:
        google.auth.default()
    except DefaultCredentialsError as err:
        raise AuthError(
            f"output_root {uri} needs Google Cloud credentials and none were found ({err}): set "
            "GOOGLE_APPLICATION_CREDENTIALS to a key file, run `gcloud auth application-default "
            "login`, or give the Airflow GCP connection (gcp_conn_id) a service-account key."
        ) from None


TF_TOKEN_VAR = "GOOGLE_AUTH_TOKEN_FOR_TESTING"
_refresher: threading.Thread | None = None
_stop = threading.Event()
log = logging.getLogger(__name__)


def share_with_tensorflow(creds: Any) -> None:
    """Point TensorFlow's gs:// at `creds` for the rest of this process (refreshed before expiry)."""
    global _refresher
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError
    from google.auth.transport.requests import Request

    if creds is None or isinstance(creds, AnonymousCredentials):
        return
    creds.refresh(Request())
    os.environ[TF_TOKEN_VAR] = creds.token

    def keep_fresh() -> None:
        while True:
            expiry = getattr(creds, "expiry", None)
            left = (expiry.timestamp() - time.time()) if expiry else 3000.0
            if _stop.wait(max(60.0, left - 600.0)):  # ten minutes before it runs out
                return
            try:
                creds.refresh(Request())
                os.environ[TF_TOKEN_VAR] = creds.token
            except GoogleAuthError as err:  # RefreshError, TransportError: keep the old token; next round retries
                log.warning("Refreshing the GCS token for TensorFlow failed (will retry): %s", type(err).__name__)

    stop_sharing_with_tensorflow()
    _stop.clear()
    _refresher = threading.Thread(target=keep_fresh, daemon=True, name="tf-gcs-token")
    _refresher.start()


def stop_sharing_with_tensorflow() -> None:
    """Stop refreshing TensorFlow's token (the variable is left as it is)."""
    if _refresher is not None and _refresher.is_alive():
        _stop.set()
        _refresher.join(timeout=5)
