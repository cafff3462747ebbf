"""How an error no retry can fix ends an Airflow task: at once, without retries, with the step's own message.

    with bad_input_fails_fast():
        step(cfg)

`mlm_tasks` raises a `NoRetryError` (mlm_tasks/errors.py) for what a person must act on: a bad input
(`ConfigError`), an artifact an earlier step did not write (`MissingArtifactError`), a refused or missing
credential (`AuthError`). A retry would fail the same way, so it becomes `AirflowFailException`.
`TransientError` and anything unforeseen keep their normal retries.
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
