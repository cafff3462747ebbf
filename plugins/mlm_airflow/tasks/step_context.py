"""What every Airflow task of a step does first: the run's config from validate's XCom, the run's GCP
connection installed, and the step's `RunContext`; and how it calls the step.

    cfg, ctx = step_context(config, data)     # config: validate's return value; data: merge_shards'
    cfg = config_from_xcom(self.config)       # an operator's templated field, the same way
    with bad_input_fails_fast(): step(cfg, ctx)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import NoRetryError
from mlm_tasks.paths import RunContext


@contextmanager
def bad_input_fails_fast() -> Iterator[None]:
    """A `NoRetryError` (mlm_tasks/errors.py) becomes AirflowFailException, so the task fails at once with the
    step's own message; anything else keeps its retries."""
    try:
        yield
    except NoRetryError as err:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from None


def xcom_dict(value: Any) -> dict[str, Any]:
    """A dict-valued XCom as a task or operator receives it: the dict, or its JSON (a template rendered as
    text). Anything else is a wiring mistake that a retry cannot fix."""
    from airflow.sdk.exceptions import AirflowFailException

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise AirflowFailException(
                f"Expected a dict or its JSON from XCom, got text that is not JSON ({err}): {value[:200]!r}. "
                "Pass the upstream task's XComArg, not a template of it."
            ) from None
    if not isinstance(value, dict):
        raise AirflowFailException(
            f"Expected a dict or its JSON from XCom, got {type(value).__name__}: {str(value)[:200]!r}. Check the "
            "upstream task's return value."
        )
    return value


def config_from_xcom(value: Any) -> PipelineConfig:
    """The run's config from validate's return value (a dict, or its JSON)."""
    return PipelineConfig.model_validate(xcom_dict(value))


def step_context(config: Any, data: Mapping[str, Any] | None = None) -> tuple[PipelineConfig, RunContext]:
    """`config`: validate's return value (or, in the validate task itself, the PipelineConfig); `data`: an
    upstream result that names the shard set (its `fingerprint`), if any."""
    from airflow.sdk import get_current_context

    from mlm_airflow.connections import install_for

    cfg = config if isinstance(config, PipelineConfig) else config_from_xcom(config)
    install_for(cfg)  # gs:// and TPU clients of this task use the run's GCP connection
    return cfg, RunContext.of(cfg, get_current_context()["run_id"], (data or {}).get("fingerprint"))
