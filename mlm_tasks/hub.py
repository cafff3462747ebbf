"""Hugging Face Hub client plumbing shared by publishing and checkpoint sync: one place that builds the
client, resolves the endpoint, and turns HTTP failures into errors that say what to do.

    api, url = hub_api(token, endpoint, conn_id="huggingface_default")
    with hub_errors("uploading the model", token, url, conn_id):
        api.upload_folder(...)

The token is only ever passed to HfApi; every message built here is scrubbed of it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

import requests

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """Publishing failed; the message says what to do and never contains the token."""


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
        raise PublishError(f"Hub endpoint {endpoint} differs from HF_ENDPOINT={constants.ENDPOINT}, which "
                           "huggingface_hub was imported with and checks commit URLs against. Set "
                           f"HF_ENDPOINT={endpoint} in the worker's environment, or leave the endpoint empty.")
    return constants.ENDPOINT


def hub_api(token: str | None, endpoint: str | None, conn_id: str):
    if not token:
        raise PublishError(f"No Hugging Face token: set the password of Airflow connection {conn_id!r} (or "
                           "HF_TOKEN for the CLI) to a token with write access.")
    from huggingface_hub import HfApi

    url = resolve_endpoint(endpoint)
    return HfApi(endpoint=url, token=token), url


@contextlib.contextmanager
def hub_errors(action: str, token: str, endpoint: str, conn_id: str):
    """Turn Hub HTTP failures into PublishErrors that say what to do (and hold no token)."""
    try:
        yield
    except requests.HTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status == 401:
            msg = (f"The Hugging Face Hub at {endpoint} rejected the token (401 Unauthorized) while {action}: "
                   f"put a valid write token in the password of Airflow connection {conn_id!r}.")
        elif status == 403:
            msg = (f"The token has no write permission (403 Forbidden) while {action} on {endpoint}: grant it "
                   "write access to that namespace, or change publish.repo_id.")
        else:
            msg = f"The Hub request failed while {action} ({status}): {err}. Retry the task; if it persists, " \
                  f"check {endpoint}."
        raise PublishError(scrub(msg, token)) from None
    except requests.ConnectionError as err:
        raise PublishError(scrub(f"Cannot reach the Hub at {endpoint} while {action}: {err}. Check the "
                                 "network or HF_ENDPOINT, then retry.", token)) from None


def local_files(folder: str) -> list[str]:
    """The files under `folder` as repo paths, without in-flight temporary files."""
    out = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if ".tmp-" not in name:
                out.append(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
    return sorted(out)


def check_visibility(api, repo_id: str, private: bool) -> None:
    """An existing repo must be as private as publish.private asks."""
    actual = api.repo_info(repo_id).private
    if private and not actual:
        raise PublishError(f"publish.private is true but the existing Hub repo {repo_id} is public: make it "
                           "private on the Hub, or set publish.private=false if public is intended.")
    if actual and not private:
        log.warning("publish.private is false but %s already exists as a private repo; it stays private", repo_id)
