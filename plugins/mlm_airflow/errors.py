"""`with bad_input_fails_fast(): step(cfg)`: a `NoRetryError` (mlm_tasks/errors.py) becomes AirflowFailException,
so the task fails at once with the step's own message; anything else keeps its retries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mlm_tasks.errors import NoRetryError


@contextmanager
def bad_input_fails_fast() -> Iterator[None]:
    try:
        yield
    except NoRetryError as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from None
