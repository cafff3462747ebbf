"""Hugging Face Hub client plumbing shared by publishing and checkpoint sync: the client with bounded requests
(process-wide: docs/security.md), and HTTP failures as errors that say what to do, scrubbed of the token (which
failure is which error: docs/architecture.md).

    api, url = hub_api(token, endpoint, conn_id="huggingface_default")
    with hub_errors("uploading the model", token, url, conn_id):
        api.upload_folder(...)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any

import requests
from requests.adapters import BaseAdapter

from mlm_tasks.errors import AuthError, ConfigError, TransientError

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 120.0  # publish.request_timeout_s's default, for callers without a config
_timeout_s = DEFAULT_TIMEOUT_S
_installed = False
RETRY_STATUSES = (408, 429)  # refusals that a later try may not meet: the rate limit, the Hub's own timeout


def scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def resolve_endpoint(endpoint: str | None) -> str:
    """The Hub URL to talk to. huggingface_hub reads HF_ENDPOINT once, at import, and parses the commit
    URLs the Hub returns against it, so an explicit endpoint must agree with it."""
    endpoint = endpoint.rstrip("/") if endpoint else None
    if endpoint and "huggingface_hub.constants" not in sys.modules:
        os.environ["HF_ENDPOINT"] = endpoint
    from huggingface_hub import constants

    if endpoint and endpoint != constants.ENDPOINT:
        raise ConfigError(
            f"Hub endpoint {endpoint} differs from HF_ENDPOINT={constants.ENDPOINT}, which "
            "huggingface_hub was imported with and checks commit URLs against. Set "
            f"HF_ENDPOINT={endpoint} in the worker's environment, or leave the endpoint empty."
        )
    return constants.ENDPOINT


class _BoundedAdapter(BaseAdapter):
    """Wraps the adapter huggingface_hub mounted (request ids, offline mode) and gives each request that
    has no timeout of its own the process's bound."""

    def __init__(self, inner: BaseAdapter):
        super().__init__()
        self.inner = inner

    def send(self, request, stream=False, timeout=None, **kwargs):
        return self.inner.send(request, stream=stream, timeout=_timeout_s if timeout is None else timeout, **kwargs)

    def close(self) -> None:
        self.inner.close()


def bound_requests(timeout_s: float) -> None:
    """Make every huggingface_hub request in this process time out after `timeout_s` (huggingface_hub
    sends most calls with no timeout)."""
    global _timeout_s, _installed
    _timeout_s = float(timeout_s)
    if _installed:
        return
    from huggingface_hub import configure_http_backend
    from huggingface_hub.utils import _http

    # The factory configured so far (huggingface_hub's own, or a user's): its sessions, bounded.
    previous = getattr(_http, "_GLOBAL_BACKEND_FACTORY", requests.Session)

    def bounded_session() -> requests.Session:
        session = previous()
        for prefix, adapter in list(session.adapters.items()):
            session.mount(prefix, _BoundedAdapter(adapter))
        return session

    configure_http_backend(backend_factory=bounded_session)  # also drops sessions made before
    _installed = True


def hub_api(token: str | None, endpoint: str | None, conn_id: str, timeout_s: float = DEFAULT_TIMEOUT_S):
    if not token:
        raise AuthError(
            f"No Hugging Face token: set the password of Airflow connection {conn_id!r} (or "
            "HF_TOKEN for the CLI) to a token with write access."
        )
    from huggingface_hub import HfApi

    url = resolve_endpoint(endpoint)
    bound_requests(timeout_s)
    return HfApi(endpoint=url, token=token), url


def is_transient(status: int | None) -> bool:
    """An HTTP status (None: no response) that a later try may not meet."""
    return status is None or status >= 500 or status in RETRY_STATUSES


@contextlib.contextmanager
def hub_errors(action: str, token: str, endpoint: str, conn_id: str):
    """Turn Hub HTTP failures into the errors of mlm_tasks.errors, saying what to do (and holding no token)."""
    kind: type[Exception] = TransientError
    try:
        yield
        return
    except requests.Timeout as err:  # before ConnectionError: a ConnectTimeout is both
        message = (
            f"The Hub at {endpoint} did not answer within publish.request_timeout_s={_timeout_s:g}s while "
            f"{action} ({type(err).__name__}): the task retries; if it persists, check {endpoint} and the "
            "network, or raise publish.request_timeout_s if the Hub is only slow."
        )
    except requests.HTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status == 401:
            kind = AuthError
            message = (
                f"The Hugging Face Hub at {endpoint} rejected the token (401 Unauthorized) while {action}: put "
                f"a valid write token in the password of Airflow connection {conn_id!r}."
            )
        elif status == 403:
            kind = AuthError
            message = (
                f"The token has no write permission (403 Forbidden) while {action} on {endpoint}: grant it "
                "write access to that namespace, or change publish.repo_id."
            )
        elif is_transient(status):
            message = (
                f"The Hub failed while {action} ({status}): {err}. The task retries; if it persists, check "
                f"the status of {endpoint}."
            )
        else:
            kind = ConfigError
            message = (
                f"The Hub refused the request while {action} ({status}): {err}. Check publish.repo_id (and "
                "publish.tokenizer_repo_id) and the files to upload."
            )
    except requests.ConnectionError as err:
        message = (
            f"Cannot reach the Hub at {endpoint} while {action}: {err}. The task retries; if it persists, "
            "check the network or HF_ENDPOINT."
        )
    raise kind(scrub(message, token)) from None


def push_folder(api, repo_id: str, folder: str, private: bool, message: str, about: str = "") -> tuple[Any, list[str]]:
    """Create `repo_id` if needed (refusing an existing one less private than asked), upload `folder` to it in
    one commit (message, description `about`); (the commit's info, the files uploaded)."""
    api.create_repo(repo_id, private=private, exist_ok=True)
    actual = api.repo_info(repo_id).private
    if private and not actual:
        raise ConfigError(
            f"publish.private is true but the existing Hub repo {repo_id} is public: make it "
            "private on the Hub, or set publish.private=false if public is intended."
        )
    if actual and not private:
        log.warning("publish.private is false but %s already exists as a private repo; it stays private", repo_id)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        ignore_patterns=["*.tmp-*", "**/*.tmp-*"],  # storage.write_bytes' temporary names: a writer's leftovers
        commit_message=message,
        commit_description=about or None,
    )
    files = [
        os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/")
        for dirpath, _, names in os.walk(folder)
        for name in names
        if ".tmp-" not in name  # in-flight temporary files
    ]
    return info, sorted(files)
