"""Can this run keep its work in output_root? A probe write (`check_writable`) and whether every worker sees
a local one (`check_output_root_reachable`), checked by validate and plan_shards before any costly work."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Sequence

from mlm_tasks import storage
from mlm_tasks.errors import AuthError, ConfigError, TransientError


def check_writable(uri: str) -> None:
    """A probe object written and removed: a run that could not save its work fails now, not after hours, as
    a ConfigError or AuthError (the user's to fix) or a TransientError (the service failed: worth a retry)."""
    probe = f"{uri.rstrip('/')}/_probes/{uuid.uuid4().hex}"
    try:
        storage.write_text(probe, "ok")
        storage.remove(probe)
    except Exception as err:
        failure = _probe_failure(uri, err)
        if failure is None:
            raise  # not what fsspec, gcsfs or google-auth raise: a bug, raised as it is
        raise failure from None


def _probe_failure(uri: str, err: Exception) -> Exception | None:
    """The kind (mlm_tasks.errors) of a failure to write under output_root `uri`, with what to do; None for a bug."""
    import aiohttp
    import requests
    from gcsfs.retry import HttpError
    from google.auth.exceptions import GoogleAuthError, TransportError

    what = " ".join(f"{type(err).__name__}: {err}".split()).rstrip(":")  # one line: gcsfs puts the reason on a second
    where = "the path and its permissions" if storage.is_local(uri) else "that the bucket exists and the path"
    fix = ConfigError(f"Cannot write to output_root {uri} ({what}): check {where}.")
    auth = AuthError(
        f"Cannot write to output_root {uri}: the credentials were refused ({what}). Give the "
        "run's identity (the Airflow GCP connection, or Application Default Credentials) write "
        "access to it."
    )
    retry = TransientError(
        f"Cannot write to output_root {uri} now: the storage service failed or did not "
        f"answer ({what}). The task retries; if it persists, check the service and the network."
    )
    if isinstance(err, HttpError):
        code = int(err.code) if str(err.code or "").isdigit() else None
        if code in (401, 403):
            return auth
        return retry if code is None or code >= 500 or code in (408, 429) else fix
    if isinstance(err, GoogleAuthError):  # getting or refreshing a token
        return retry if isinstance(err, TransportError) or getattr(err, "retryable", False) else auth
    # After gcsfs' retries: a 502 (ProxyError), a refused or dropped connection, a timeout.
    if isinstance(err, (requests.RequestException, aiohttp.ClientError, TimeoutError, ConnectionError)):
        return retry
    if type(err) is OSError and str(err).startswith("Forbidden"):
        return auth  # gcsfs raises a 403 as a bare OSError
    if isinstance(err, (PermissionError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)):
        return fix  # a local folder we may not write, a missing bucket (404), a file where a folder should be
    if isinstance(err, OSError):
        full = err.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG)
        return fix if full else retry  # read-only or full: a person acts; EIO and the like may pass
    # gcsfs' 400 "invalid" (a bad bucket name) is a ValueError; no driver for the scheme an ImportError.
    return fix if isinstance(err, (ValueError, ImportError)) else None


def check_output_root_reachable(
    output_root: str, distributed_executor: str | None, shared_roots: Sequence[str] = ()
) -> None:
    """A local output_root works only when every task sees the same folder: one machine, or a declared shared
    mount. `distributed_executor` names the executor when it may spread tasks over machines."""
    if not distributed_executor or not storage.is_local(output_root):
        return
    path = os.path.abspath(storage.local_path(output_root))
    if any(path == s or path.startswith(s.rstrip(os.sep) + os.sep) for s in map(os.path.abspath, shared_roots)):
        return
    raise ConfigError(
        f"output_root {output_root} is a local folder, but the {distributed_executor} may run this run's tasks "
        "on several workers, and a worker on another machine would not see the files the others wrote. Use "
        "output_root gs://bucket/prefix, or, if this folder is a shared mount (NFS, Filestore) at the same path "
        "on every worker, declare it in the environment of every Airflow service: "
        f"MLM_SHARED_OUTPUT_ROOTS={path}"
    )
