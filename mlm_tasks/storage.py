"""One storage API for local folders and gs:// (fsspec/gcsfs), chosen by URI scheme.

Writes are atomic at the file level: a reader sees a whole file or none. Local files are written
to a temporary name and renamed; a GCS object upload is atomic by itself. `create_only` gives
first-writer-wins for artifacts that must not be replaced once published (the tokenizer).
gs:// clients (gcsfs, google-cloud-storage) use the credentials handed to `mlm_tasks.credentials`
(on the Airflow side: the run's GCP connection), else Application Default Credentials.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from typing import Any

import fsspec

from mlm_tasks import credentials
from mlm_tasks.errors import AuthError, ConfigError, TransientError

# gcsfs' HNS probe stalls ~60 s a call against anything but the real service; we never use HNS.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else "file"


def is_local(uri: str) -> bool:
    return scheme(uri) == "file"


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def filesystem(uri: str) -> fsspec.AbstractFileSystem:
    if scheme(uri) == "gs":
        # No listings cache: gcsfs would otherwise answer exists()/ls() from a listing taken
        # earlier in this process, missing objects written since (by create_only, TensorFlow or
        # another worker), and a poll for a marker would never see it appear.
        opts: dict[str, Any] = {"use_listings_cache": False}
        creds = credentials.current()
        if creds is not None:
            # The connection's credentials (gcsfs refreshes them itself). The emulator accepts any
            # token and checks none, so tests assert which object was used, not what it may do.
            opts["token"] = creds
        elif os.environ.get("STORAGE_EMULATOR_HOST"):
            # The emulator takes no credentials; gcsfs reads the host from the environment itself.
            opts["token"] = "anon"
        return fsspec.filesystem("gs", **opts)
    return fsspec.filesystem(scheme(uri))


def sha256(uri: str) -> str:
    """The hex sha256 of the file or object at `uri`, read in blocks (shards and dumps are large)."""
    h = hashlib.sha256()
    with filesystem(uri).open(uri, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def exists(uri: str) -> bool:
    return filesystem(uri).exists(uri)


def read_bytes(uri: str) -> bytes:
    return filesystem(uri).cat_file(uri)


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def read_json_if_exists(uri: str) -> Any | None:
    try:
        return read_json(uri)
    except FileNotFoundError:
        return None


def _write_temp(path: str, data: bytes) -> str:
    """Write `data` durably to a fresh temporary name beside `path`; returns that name."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def write_bytes(uri: str, data: bytes) -> None:
    if is_local(uri):
        path = local_path(uri)
        tmp = _write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    else:
        filesystem(uri).pipe_file(uri, data)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def create_only(uri: str, data: bytes) -> bool:
    """Write `uri` only if nothing is there yet; True if this call wrote it.

    Local: hard-link a finished temp file (link fails if the name exists). gs://: upload with
    ifGenerationMatch=0, which GCS rejects with 412 once any generation of the object exists.
    """
    if scheme(uri) not in ("file", "gs"):
        raise ValueError(f"create_only supports local paths and gs:// URIs, not {uri!r}.")
    if is_local(uri):
        path = local_path(uri)
        tmp = _write_temp(path, data)
        try:
            os.link(tmp, path)  # atomic, and fails if the target exists
            return True
        except FileExistsError:
            return False
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    from google.api_core.exceptions import PreconditionFailed

    bucket, _, name = uri[len("gs://"):].partition("/")
    try:
        _gcs_client().bucket(bucket).blob(name).upload_from_string(data, if_generation_match=0)
        return True
    except PreconditionFailed:
        return False


def _gcs_client():
    from google.cloud import storage as gcs

    handed = credentials.handed()
    if handed is not None:
        project = handed.project or ("emulator" if os.environ.get("STORAGE_EMULATOR_HOST") else None)
        return gcs.Client(project=project, credentials=handed.credentials)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return gcs.Client(project="emulator", credentials=AnonymousCredentials())
    return gcs.Client()


def listdir(uri: str) -> list[str]:
    """Full URIs of the files directly under `uri` (empty if it does not exist)."""
    fs = filesystem(uri)
    if not fs.exists(uri):
        return []
    prefix = "gs://" if scheme(uri) == "gs" else ""
    return sorted(prefix + p for p in fs.ls(uri, detail=False))


def remove(uri: str, recursive: bool = False) -> None:
    fs = filesystem(uri)
    if fs.exists(uri):
        fs.rm(uri, recursive=recursive)


def upload_dir(local_dir: str, uri: str) -> None:
    """Copy a local folder's files to `uri` (each file atomically)."""
    for dirpath, _, files in os.walk(local_dir):
        for name in files:
            src = os.path.join(dirpath, name)
            rel = os.path.relpath(src, local_dir).replace(os.sep, "/")
            with open(src, "rb") as f:
                write_bytes(f"{uri.rstrip('/')}/{rel}", f.read())


def download_dir(uri: str, local_dir: str) -> str:
    """Make a folder at `uri` available locally (HF loaders need local files); returns the path."""
    if is_local(uri):
        return local_path(uri)
    fs = filesystem(uri)
    os.makedirs(local_dir, exist_ok=True)
    fs.get(uri.rstrip("/") + "/", local_dir.rstrip("/") + "/", recursive=True)
    return local_dir


def check_writable(uri: str) -> None:
    """A probe object written and removed: a run that could not save its work fails now, not after hours.

    A wrong path or a missing permission is the user's to fix (ConfigError, AuthError); a service that
    failed or did not answer is worth a retry (TransientError, raised after gcsfs' own retries)."""
    import aiohttp
    import requests
    from gcsfs.retry import HttpError
    from google.auth.exceptions import GoogleAuthError

    probe = f"{uri.rstrip('/')}/_probes/{uuid.uuid4().hex}"
    try:
        write_text(probe, "ok")
        remove(probe)
    except (OSError, ValueError, ImportError, HttpError, GoogleAuthError, requests.RequestException,
            aiohttp.ClientError) as err:  # what fsspec, gcsfs and google-auth raise; the rest is a bug, raised as it is
        raise probe_failure(uri, err) from None


def probe_failure(uri: str, err: Exception) -> Exception:
    """The kind (mlm_tasks.errors) of a failure to write under output_root `uri`, with what to do."""
    import aiohttp
    import requests
    from gcsfs.retry import HttpError
    from google.auth.exceptions import GoogleAuthError, TransportError

    what = " ".join(f"{type(err).__name__}: {err}".split()).rstrip(":")  # one line: gcsfs puts the reason on a second
    where = "the path and its permissions" if is_local(uri) else "that the bucket exists and the path"
    fix = ConfigError(f"Cannot write to output_root {uri} ({what}): check {where}.")
    auth = AuthError(f"Cannot write to output_root {uri}: the credentials were refused ({what}). Give the "
                     "run's identity (the Airflow GCP connection, or Application Default Credentials) write "
                     "access to it.")
    retry = TransientError(f"Cannot write to output_root {uri} now: the storage service failed or did not "
                           f"answer ({what}). The task retries; if it persists, check the service and the network.")
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
    return fix  # ValueError (gcsfs' 400 "invalid": a bad bucket name), ImportError (no driver for the scheme)
