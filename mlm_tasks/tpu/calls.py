"""The TPU v2 API client and the bounds of every call to it, for the node (mlm_tasks/tpu/api.py) and the
queued resource (mlm_tasks/tpu/queued.py) alike.

    api = client(cfg)                                       # the handed-in credentials, else ADC
    with answered(cfg, "get_node n"):                       # a timeout names the call and API_TIMEOUT_S
        api.get_node(name=..., **limits(cfg))               # retried on 429/503 only, each attempt bounded

Every call is retried on 429 and 503, the answers Google gives for a busy API (for at most
RETRY_DEADLINE_S), and nothing else is. Every request is bounded by `API_TIMEOUT_S`: a hung API or
network fails the call with a DeadlineExceeded that says so (a 504, so pollers treat it as transient).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from mlm_tasks import credentials

if TYPE_CHECKING:  # types only: config imports this package's tables, so tpu/ imports no config at run time
    from google.cloud.tpu_v2 import TpuClient

    from mlm_tasks.config import TpuConfig

log = logging.getLogger("mlm_tasks.tpu.api")  # where these calls logged before they had a module of their own
NOT_FOUND = "NOT_FOUND"  # the state of a node or queued resource the API does not know
NAME_PREFIX = "mlm-"  # what every node (and queued resource) this project makes is named with

# First wait of the 429/503 retry (doubling up to 30 s, 5 min in all); tests shorten it.
RETRY_INITIAL_S = float(os.environ.get("MLM_TPU_RETRY_INITIAL_S", "1.0"))
RETRY_DEADLINE_S = 300.0  # how long busy answers are retried in all; each attempt is bounded by API_TIMEOUT_S
API_TIMEOUT_S = 60.0  # one TPU API request unanswered this long fails (a hung API or network)


def client(cfg: TpuConfig) -> TpuClient:
    """A TpuClient for cfg with the handed-in credentials (see mlm_tasks.credentials), else ADC."""
    from google.cloud import tpu_v2

    creds = credentials.current()
    if creds is None:
        log.info("TPU API: no credentials handed in, using Application Default Credentials.")
    options = {"api_endpoint": cfg.api_endpoint} if cfg.api_endpoint else None
    return tpu_v2.TpuClient(transport=cfg.transport, credentials=creds, client_options=options)


def retry():
    """Retry what Google answers when the API is busy (429, 503); any other error is final."""
    from google.api_core.exceptions import ServiceUnavailable, TooManyRequests
    from google.api_core.retry import Retry, if_exception_type

    return Retry(
        predicate=if_exception_type(TooManyRequests, ServiceUnavailable),
        initial=RETRY_INITIAL_S,
        maximum=30.0,
        multiplier=2.0,
        timeout=RETRY_DEADLINE_S,
    )


def limits(cfg: TpuConfig, timeout_s: float | None = None) -> dict[str, Any]:
    """`retry=` and `timeout=` for one client call: each attempt waits at most API_TIMEOUT_S (a constant
    per attempt; a plain number would be a deadline shared with the retries of busy answers)."""
    from google.api_core.timeout import ConstantTimeout

    return {"retry": retry(), "timeout": ConstantTimeout(min(timeout_s or API_TIMEOUT_S, API_TIMEOUT_S))}


@contextlib.contextmanager
def answered(cfg: TpuConfig, what: str):
    """Turn a request that timed out (REST: requests' Timeout; gRPC: DeadlineExceeded) into one
    DeadlineExceeded naming the call and the setting, so a hung API reads as such in the task log."""
    import requests
    from google.api_core.exceptions import DeadlineExceeded

    try:
        yield
    except (requests.Timeout, DeadlineExceeded) as err:
        endpoint = cfg.api_endpoint or "tpu.googleapis.com"
        raise DeadlineExceeded(
            f"The TPU API at {endpoint} did not answer {what} within {API_TIMEOUT_S:g}s "
            f"({type(err).__name__}): check the network and the endpoint, then retry the task (later, if the API "
            "is only slow)."
        ) from err


def parent(cfg: TpuConfig) -> str:
    return f"projects/{cfg.project}/locations/{cfg.zone}"
