"""One storage API for local folders and gs:// (fsspec/gcsfs): `scheme(uri)` is the one dispatch.

Writes are atomic per file; `create_only` is first-writer-wins. Every gs:// call has a deadline
(`set_timeout`, `call_deadline`): past it the call is cancelled and fails as a TransientError."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import fsspec

from mlm_tasks import credentials
from mlm_tasks.errors import ConfigError, TransientError
from mlm_tasks.paths import bucket_and_name, scheme  # the one dispatch: storage.scheme(uri)

# gcsfs' HNS probe stalls ~60 s a call against anything but the real service; we never use HNS.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 600.0
# A call may retry a stalled request twice within its deadline; a transfer adds a second per MiB (it
# fails only below that rate, which no healthy link is).
ATTEMPTS_PER_CALL = 3
MIN_BYTES_PER_S = 1 << 20
_timeout_s = DEFAULT_TIMEOUT_S
T = TypeVar("T")


def set_timeout(seconds: float) -> None:
    """Set the seconds a gs:// request may wait for a connection or its next bytes (`storage.timeout_s`)."""
    global _timeout_s
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise ConfigError(f"storage.timeout_s {seconds!r} must be above 0 and at most {MAX_TIMEOUT_S:g} seconds.")
    _timeout_s = float(seconds)


def call_deadline(nbytes: int = 0) -> float:
    """Seconds one storage call may take in all, retries included, plus time for the bytes it moves."""
    return ATTEMPTS_PER_CALL * _timeout_s + nbytes / MIN_BYTES_PER_S


def tensorflow_env() -> dict[str, str]:
    """TensorFlow's gs:// client bounds: connect and idle as ours, metadata calls as one of our calls (its
    read/write totals keep TensorFlow's hour, which a large shard or checkpoint may need)."""
    seconds = str(max(1, round(_timeout_s)))
    return {
        "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": seconds,
        "GCS_REQUEST_IDLE_TIMEOUT_SECS": seconds,
        "GCS_METADATA_REQUEST_TIMEOUT_SECS": str(max(1, round(call_deadline()))),
    }


def _bounded(uri: str, call: Callable[..., T], *args: Any, nbytes: int = 0, **kwargs: Any) -> T:
    """`call(*args)` of a gs:// filesystem within its deadline (fsspec cancels it then); a deadline passed or a
    connection that failed after gcsfs' retries is a TransientError. Local calls run as they are."""
    if is_local(uri):
        return call(*args, **kwargs)
    import aiohttp
    from fsspec.exceptions import FSTimeoutError

    deadline = call_deadline(nbytes)
    try:
        return call(*args, timeout=deadline, **kwargs)
    except (FSTimeoutError, TimeoutError, aiohttp.ServerTimeoutError, aiohttp.ClientConnectionError) as err:
        raise _no_answer(uri, deadline, err) from None


def _no_answer(uri: str, deadline: float, err: BaseException) -> TransientError:
    return TransientError(
        f"Storage did not answer for {uri} within {deadline:g}s ({type(err).__name__}: "
        f"{err or 'no answer'}; storage.timeout_s={_timeout_s:g}s a request). The task retries; "
        "if it persists, check the network and the storage service, or raise storage.timeout_s "
        "if the link is only slow."
    )


def is_local(uri: str) -> bool:
    return scheme(uri) == "file"


def local_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


def filesystem(uri: str) -> fsspec.AbstractFileSystem:
    if scheme(uri) != "gs":
        return fsspec.filesystem(scheme(uri))
    import aiohttp

    opts: dict[str, Any] = {
        # No listings cache: exists()/ls() would miss objects written since (a marker a poll waits for).
        "use_listings_cache": False,
        # A connection and every next chunk of an answer within the timeout (gcsfs retries); `_bounded` caps the call.
        "requests_timeout": aiohttp.ClientTimeout(total=None, sock_connect=_timeout_s, sock_read=_timeout_s),
    }
    creds, emulator = credentials.current(), os.environ.get("STORAGE_EMULATOR_HOST")
    if creds is not None or emulator:
        opts["token"] = creds if creds is not None else "anon"  # gcsfs refreshes them; the emulator takes none
    if emulator:
        # Named (gcsfs also reads the environment), the endpoint is part of fsspec's instance cache key.
        opts["endpoint_url"] = emulator
    return fsspec.filesystem("gs", **opts)


def sha256(uri: str) -> str:
    """The hex sha256 of the file or object at `uri`, read in blocks (shards and dumps are large)."""
    h = hashlib.sha256()
    with filesystem(uri).open(uri, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def exists(uri: str) -> bool:
    return _bounded(uri, filesystem(uri).exists, uri)


def size(uri: str) -> int:
    return int(_bounded(uri, filesystem(uri).size, uri))


def read_bytes(uri: str) -> bytes:
    """A record or a small file, whole (a large one: `copy_to_local`, or stream it with `filesystem(uri).open`)."""
    return _bounded(uri, filesystem(uri).cat_file, uri)


def copy_to_local(uri: str, path: str) -> None:
    """Copy one file of any size to the local `path`, within a deadline that grows with its size."""
    _bounded(uri, filesystem(uri).get_file, uri, path, nbytes=size(uri))


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def read_json_if_exists(uri: str) -> Any | None:
    try:
        return read_json(uri)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _temp_beside(path: str, data: bytes) -> Iterator[str]:
    """`data` written durably to a fresh temporary name beside `path`, removed after the block if still there."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes(uri: str, data: bytes) -> None:
    if is_local(uri):
        with _temp_beside(local_path(uri), data) as tmp:
            os.replace(tmp, local_path(uri))
    else:
        _bounded(uri, filesystem(uri).pipe_file, uri, data, nbytes=len(data))


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def create_only(uri: str, data: bytes) -> bool:
    """Write `uri` only if nothing is there yet; True if this call wrote it. Local: hard-link a finished
    temp file (fails if the name exists); gs://: upload with ifGenerationMatch=0 (412 once any exists)."""
    if scheme(uri) not in ("file", "gs"):
        raise ValueError(f"create_only supports local paths and gs:// URIs, not {uri!r}.")
    if is_local(uri):
        with _temp_beside(local_path(uri), data) as tmp:
            try:
                os.link(tmp, local_path(uri))  # atomic, and fails if the target exists
                return True
            except FileExistsError:
                return False
    from google.api_core.exceptions import GatewayTimeout, PreconditionFailed, RetryError, ServiceUnavailable
    from google.cloud.storage.retry import DEFAULT_RETRY
    from requests import ConnectionError as RequestsConnectionError
    from requests import Timeout

    bucket, name = bucket_and_name(uri)
    deadline = call_deadline(len(data))
    try:
        # The precondition makes a repeat safe, so the client's retry applies, up to the call's deadline.
        _gcs_client().bucket(bucket).blob(name).upload_from_string(
            data, if_generation_match=0, timeout=(_timeout_s, _timeout_s), retry=DEFAULT_RETRY.with_timeout(deadline)
        )
        return True
    except PreconditionFailed:
        return False
    except (RetryError, ServiceUnavailable, GatewayTimeout, Timeout, RequestsConnectionError) as err:
        raise _no_answer(uri, deadline, err) from None


def _gcs_client():
    from google.cloud import storage as gcs

    handed, emulator = credentials.handed(), os.environ.get("STORAGE_EMULATOR_HOST")
    if handed is not None:
        return gcs.Client(project=handed.project or ("emulator" if emulator else None), credentials=handed.credentials)
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return gcs.Client(project="emulator", credentials=AnonymousCredentials())
    return gcs.Client()


def listdir(uri: str, kind: str | None = None) -> list[str]:
    """Full URIs directly under `uri`, sorted (`kind`: only "file"s or "directory"s); empty if it does not exist."""
    if not exists(uri):
        return []
    prefix = "gs://" if scheme(uri) == "gs" else ""
    listed = _bounded(uri, filesystem(uri).ls, uri, detail=True)
    return sorted(prefix + e["name"] for e in listed if kind is None or e["type"] == kind)


def subdirs(uri: str) -> list[str]:
    """Full URIs of the folders directly under `uri` (empty if it does not exist)."""
    return [d.rstrip("/") for d in listdir(uri, kind="directory")]


def find(uri: str) -> dict[str, dict[str, Any]]:
    """Every file below `uri` with its details (size, generation or mtime), by path; empty if none."""
    try:
        return _bounded(uri, filesystem(uri).find, local_path(uri), detail=True) if exists(uri) else {}
    except FileNotFoundError:
        return {}


def glob(pattern: str) -> dict[str, dict[str, Any]]:
    """The files `pattern` (a path, or a glob with * ? [] **) matches, by URI in sorted order, with their
    listing details (`size`; gs:// also `md5Hash`, `crc32c`, `generation`); local ones in the pattern's form."""
    if is_local(pattern):
        import glob as local_glob

        matched = (p for p in local_glob.glob(local_path(pattern)) if os.path.isfile(p))
        return {p: {"size": os.path.getsize(p)} for p in sorted(matched)}
    fs = filesystem(pattern)
    listed = _bounded(pattern, fs.glob, pattern, detail=True)
    files = {fs.unstrip_protocol(name): info for name, info in listed.items() if info.get("type") != "directory"}
    return dict(sorted(files.items()))


def remove(uri: str, recursive: bool = False) -> None:
    if exists(uri):
        _bounded(uri, filesystem(uri).rm, uri, recursive=recursive)


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
    os.makedirs(local_dir, exist_ok=True)
    for path, info in find(uri).items():
        if path.endswith("/"):
            continue  # a folder marker (TensorFlow's makedirs), not a file
        rel = path.removeprefix(uri.removeprefix("gs://").rstrip("/") + "/")
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _bounded(uri, filesystem(uri).get_file, "gs://" + path, target, nbytes=int(info.get("size") or 0))
    return local_dir
