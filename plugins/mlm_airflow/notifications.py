"""Tell someone when a task has failed for good (`"on_failure_callback": [FailureNotifier()]`): a log line, and
a JSON POST to `MLM_ALERT_WEBHOOK_URL` or the host of connection `mlm_alerts` (docs/configuration.md). The body
is scrubbed of secrets (webhooks land in chat rooms); a webhook that is down is logged, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier, Context

log = logging.getLogger(__name__)

WEBHOOK_ENV = "MLM_ALERT_WEBHOOK_URL"
WEBHOOK_CONN_ID = "mlm_alerts"
# Secrets that may sit in an error message without Airflow knowing them (not from a connection).
_TOKEN_PATTERNS = [
    re.compile(r"hf_[A-Za-z0-9]{16,}"),  # Hugging Face tokens
    re.compile(r"ya29\.[A-Za-z0-9_\-.]+"),  # Google OAuth access tokens
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-.=]{8,}"),
    re.compile(r"(?i)(\b(?:token|password|passwd|secret|api_key|apikey|key)[\"']?\s*[=:]\s*[\"']?)[^\s\"'&,;]+"),
    re.compile(r"(://[^/\s:@]+:)[^@\s/]+(@)"),  # user:password@ in URLs
]


def scrub(text: str) -> str:
    """`text` with Airflow's masked values and token-shaped strings replaced by ***."""
    try:
        from airflow.sdk._shared.secrets_masker import redact  # private path; the public one is for logs

        text = str(redact(text))
    except ImportError:  # a future layout: the patterns below still apply
        pass
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(
            lambda m: (m.group(1) if m.groups() else "") + "***" + (m.group(2) if len(m.groups()) > 1 else ""), text
        )
    return text


def webhook_url() -> str | None:
    if url := os.environ.get(WEBHOOK_ENV):
        return url
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(WEBHOOK_CONN_ID)
    except AirflowNotFoundException:  # absence just means "log only"; a lookup that failed is raised
        return None
    host = conn.host or ""
    if host and "://" not in host:
        host = f"{conn.schema or 'https'}://{host}"
    return host or None


class FailureNotifier(BaseNotifier):
    """on_failure_callback: log the failure and POST it as JSON to the configured webhook."""

    def notify(self, context: Context) -> None:
        ti, exception = context["ti"], context.get("exception")
        payload: dict[str, Any] = {
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "try_number": ti.try_number,
            "max_tries": ti.max_tries,
            "log_url": ti.log_url,
            "exception": scrub(f"{type(exception).__name__}: {exception}") if exception is not None else None,
        }
        log.error(
            "Task failed: %(dag_id)s.%(task_id)s run %(run_id)s, try %(try_number)s of %(tries)s; log: %(log_url)s; "
            "error: %(exception)s",
            {**payload, "tries": payload["max_tries"] + 1},
        )
        url = webhook_url()
        if not url:
            log.info(
                "No alert webhook (set %s or the %r connection): failure logged only.", WEBHOOK_ENV, WEBHOOK_CONN_ID
            )
            return
        request = urllib.request.Request(
            url, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        target = "{0.scheme}://{0.hostname}".format(urlsplit(url))  # webhook paths often hold a secret
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                log.info("Failure alert sent to %s (HTTP %s)", target, response.status)
        except OSError as err:
            log.error(
                "Could not send the failure alert to %s: %s. Check %s or the %r connection.",
                *(target, err, WEBHOOK_ENV, WEBHOOK_CONN_ID),
            )
