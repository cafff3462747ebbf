"""How a bad input ends an Airflow task: at once, without retries, with the step's own message.

    with bad_input_fails_fast():
        step(cfg)

`mlm_tasks` raises `ConfigError` for anything the user must change (a setting, a path, data that
does not fit); retrying cannot fix that, so it becomes `AirflowFailException`. Other errors keep
their normal retries.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mlm_tasks.config import ConfigError


@contextmanager
def bad_input_fails_fast() -> Iterator[None]:
    try:
        yield
    except ConfigError as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from None
