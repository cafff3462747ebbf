"""An operator run the way Airflow runs a deferrable one, in this process: the worker and the triggerer.

    result = run_deferrable(op, lambda: context)                    # execute, then each trigger and resume
    result = run_deferrable(op, lambda: context, tweak=lambda trigger: ...)

On each TaskDeferred the trigger is rebuilt from its serialized kwargs (through JSON, as the triggerer
stores them), run to its first event, and the operator resumes in the deferral's method with that event.
A deferral's own timeout, when shorter than `timeout` (the test's bound on any one trigger), ends its
trigger as the scheduler's check_trigger_timeouts does: the operator resumes in resume_execution with
next_method "__fail__" and the error "Trigger timeout" (Airflow's TaskDeferralTimeout, unless the
operator handles it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason
from airflow.sdk.exceptions import TaskDeferred


def rebuilt(trigger: Any) -> Any:
    """The trigger as the triggerer gets it back from the database."""
    _classpath, kwargs = trigger.serialize()
    return type(trigger)(**json.loads(json.dumps(kwargs)))


async def first_event(trigger: Any) -> Any:
    async for event in trigger.run():
        return event.payload
    return None


def run_deferrable(
    op: Any, context: Callable[[], dict], *, tweak: Callable[[Any], None] | None = None, timeout: float = 60
) -> Any:
    call, args = op.execute, (context(),)
    while True:
        try:
            return call(*args)
        except TaskDeferred as deferred:
            if tweak:
                tweak(deferred.trigger)
            limit = deferred.timeout.total_seconds() if deferred.timeout is not None else None
            try:
                event = asyncio.run(
                    asyncio.wait_for(first_event(rebuilt(deferred.trigger)), min(limit or timeout, timeout))
                )
            except TimeoutError:
                if limit is None or limit >= timeout:
                    raise
                timed_out = {"error": TriggerFailureReason.TRIGGER_TIMEOUT.value}
                call, args = op.resume_execution, (TRIGGER_FAIL_REPR, timed_out, context())
                continue
            call = getattr(op, deferred.method_name)
            if deferred.kwargs:  # Airflow resumes with the deferral's kwargs as keyword arguments
                call = _with_kwargs(call, deferred.kwargs)
            args = (context(), event)


def _with_kwargs(method: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[..., Any]:
    kwargs = json.loads(json.dumps(kwargs))  # stored in the database as JSON, like the trigger's

    def call(*args: Any) -> Any:
        return method(*args, **kwargs)

    return call
