"""The TPU v2 API client and the bounds of every call to it (nodes and queued resources alike).

    node = call(cfg, client(cfg), "get_node", "n", missing=True, name=...)   # None: NOT_FOUND

A busy API (503, a 429 on the request rate) is retried for RETRY_DEADLINE_S, nothing else is; an attempt
unanswered for API_TIMEOUT_S fails, naming the call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import TYPE_CHECKING, Any, Literal

from mlm_tasks import credentials

if TYPE_CHECKING:  # types only: config imports this package's tables, so tpu/ imports no config at run time
    from google.cloud.tpu_v2 import TpuClient

    from mlm_tasks.config import TpuConfig

log = logging.getLogger("mlm_tasks.tpu.api")
NOT_FOUND = "NOT_FOUND"  # the state of a node or queued resource the API does not know
NAME_PREFIX = "mlm-"  # what every node (and queued resource) this project makes is named with

# First wait of the 429/503 retry (doubling up to 30 s, 5 min in all); tests shorten it.
RETRY_INITIAL_S = float(os.environ.get("MLM_TPU_RETRY_INITIAL_S", "1.0"))
RETRY_DEADLINE_S = 300.0  # how long busy answers are retried in all
API_TIMEOUT_S = 60.0  # one TPU API request unanswered this long fails (a hung API or network)

# A create's error: a stockout (code 8, "no more capacity in the zone"), a full reservation (code 9), a Spot node
# taken back before READY (code 3, "... in state PREEMPTED"), or a quota (final; the 'Requests' quota is a busy API).
_STOCKOUT = re.compile(r"no more capacity|lack of capacity|insufficient capacity|out of capacity|stockout", re.I)
_QUOTA = re.compile(r"quota\b(?!.*metric 'Requests')", re.I | re.S)


def capacity(error: str | None) -> Literal["quota", "preempted", "reserved", "stockout"] | None:
    """What a create's error says about capacity (None: nothing, an ordinary failure)."""
    if not error:
        return None
    if _QUOTA.search(error) and "capacity" not in error.lower():
        return "quota"
    if "(code 3)" in error and "PREEMPTED" in error:
        return "preempted"
    if "(code 9)" in error or "reserved capacity" in error.lower():
        return "reserved"
    return "stockout" if _STOCKOUT.search(error) else None


def client(cfg: TpuConfig) -> TpuClient:
    """A TpuClient for cfg with the handed-in credentials (see mlm_tasks.credentials), else ADC."""
    from google.cloud import tpu_v2

    creds = credentials.current()
    if creds is None:
        log.info("TPU API: no credentials handed in, using Application Default Credentials.")
    options = {"api_endpoint": cfg.api_endpoint} if cfg.api_endpoint else None
    return tpu_v2.TpuClient(transport=cfg.transport, credentials=creds, client_options=options)


def busy(err: Exception) -> bool:
    """Whether an answer says the API is busy (a 503, or a 429 on the request rate): worth retrying. A 429 that
    names a resource quota is final: waiting does not raise a quota."""
    from google.api_core.exceptions import ServiceUnavailable, TooManyRequests

    if isinstance(err, TooManyRequests):
        return capacity(str(err.message)) != "quota"
    return isinstance(err, ServiceUnavailable)


def limits(deadline_s: float = RETRY_DEADLINE_S) -> dict[str, Any]:
    """`retry=` and `timeout=` for one client call: busy answers retried until deadline_s, each attempt waiting
    at most API_TIMEOUT_S (a constant per attempt: a plain number is a deadline shared with the retries)."""
    from google.api_core.retry import Retry
    from google.api_core.timeout import ConstantTimeout

    retry = Retry(predicate=busy, initial=RETRY_INITIAL_S, maximum=30.0, multiplier=2.0, timeout=deadline_s)
    return {"retry": retry, "timeout": ConstantTimeout(min(deadline_s, API_TIMEOUT_S))}


@contextlib.contextmanager
def answered(cfg: TpuConfig, what: str):
    """Turn a request that timed out (REST or gRPC) into one DeadlineExceeded that names the call."""
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


def call(cfg: TpuConfig, api: TpuClient | None, method: str, what: str, missing: bool = False, **request: Any) -> Any:
    """`api.<method>(**request)` within `limits`, named `<method> <what>` in a timeout; with `missing`, None when
    the API does not know the resource (NotFound)."""
    from google.api_core.exceptions import NotFound

    try:
        with answered(cfg, f"{method} {what}"):
            return getattr(api or client(cfg), method)(**request, **limits())
    except NotFound:
        if not missing:
            raise
        return None


def parent(cfg: TpuConfig) -> str:
    return f"projects/{cfg.project}/locations/{cfg.zone}"
