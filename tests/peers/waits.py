"""Small helpers for tests that watch real processes.

found = wait_for("the trainer's first step", lambda: read_status(run))   # its truthy value, or fails
message = error_text(op.execute, context)     # the AirflowException's text ("no error" if none)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0, poll_s: float = 0.05) -> Any:
    """check()'s first truthy value; an AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
    return found


def error_text(fn: Callable[..., Any], *args: Any) -> str:
    """The message of the AirflowException `fn(*args)` raises, or "no error"."""
    from airflow.sdk.exceptions import AirflowException

    try:
        fn(*args)
    except AirflowException as err:
        return str(err)
    return "no error"
