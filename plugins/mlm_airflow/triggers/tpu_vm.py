"""Trigger that polls the TPU API until a node stops changing by itself, then fires once with {"name", "state",
"error", "node", "deadline", "stockout_until"}: READY, NOT_FOUND, a dead end, the create operation's error, or
"TIMEOUT" at `deadline`. `not_before` delays the first poll (the pause between creates in a stockout); with
`until_gone` only NOT_FOUND, an error or the deadline end the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from airflow.triggers.base import TriggerEvent

from mlm_airflow.triggers import ConnectionTrigger
from mlm_tasks.config import TpuConfig
from mlm_tasks.tpu import api as tpu


@dataclass(eq=False, repr=False)
class TpuNodeTrigger(ConnectionTrigger):
    classpath = "mlm_airflow.triggers.tpu_vm.TpuNodeTrigger"

    tpu_config: dict[str, Any]
    name: str
    deadline: float
    operation: str | None = None
    poll_interval_s: float = 15.0
    gcp_conn_id: str = "google_cloud_default"
    until_gone: bool = False
    not_before: float | None = None
    stockout_until: float | None = None

    def _check(self) -> dict[str, Any] | None:
        """One poll with the connection's credentials; the event payload when waiting is over, else None."""
        cfg = TpuConfig.model_validate(self.tpu_config)
        with self.connected():
            state, error = tpu.node_now(cfg, self.name, self.operation, until_gone=self.until_gone)
        settled = state.state == tpu.NOT_FOUND if self.until_gone else not tpu.passing(state.state)
        if error or settled:
            return self._event(state.state, error, tpu.describe(state))
        if time.time() >= self.deadline:
            return self._event("TIMEOUT", f"still {state.state}", None)
        self.log.info("TPU VM %s is %s; checking again in %ss.", self.name, state.state, self.poll_interval_s)
        return None

    def _event(self, state: str, error: str | None, node: dict[str, Any] | None) -> dict[str, Any]:
        ids = {"name": self.name, "deadline": self.deadline, "stockout_until": self.stockout_until}
        return {**ids, "state": state, "error": error, "node": node}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from google.api_core.exceptions import RetryError, ServerError, TooManyRequests

        if self.not_before is not None:  # a stockout: the next create waits until then
            await asyncio.sleep(max(0.0, self.not_before - time.time()))
        while True:
            try:
                payload = await asyncio.to_thread(self._check)
            except (ServerError, TooManyRequests, RetryError) as err:  # transient: poll again
                self.log.warning("TPU API error while polling %s (will retry): %s", self.name, err)
                payload = None
            if payload is not None:
                yield TriggerEvent(payload)
                return
            await asyncio.sleep(self.poll_interval_s)
