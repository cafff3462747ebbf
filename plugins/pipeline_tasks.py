"""Airflow callables for the pipeline's steps: read params and XCom, call `mlm_tasks`, return small dicts.

No ML logic lives here: each callable turns the Airflow context into plain arguments for one
`mlm_tasks` step. TensorFlow and transformers are imported by the steps themselves, at run time,
so parsing a DAG that uses these stays fast.
"""
from __future__ import annotations

import logging
from typing import Any

from mlm_tasks.config import ConfigError, PipelineConfig, config_from_params

log = logging.getLogger(__name__)

CONFIG_XCOM = "{{ ti.xcom_pull(task_ids='validate_config') }}"


def _config(ti) -> PipelineConfig:
    return PipelineConfig.model_validate(ti.xcom_pull(task_ids="validate_config"))


def _fingerprint(ti) -> str:
    return ti.xcom_pull(task_ids="prepare_data")["fingerprint"]


def validate_config(params: dict, **_: Any) -> dict:
    """First task: every setting and input checked, before anything costs time or money."""
    from airflow.exceptions import AirflowFailException

    from mlm_tasks.validate import validate_inputs

    try:
        cfg = config_from_params(params)
        validate_inputs(cfg)
    except ConfigError as err:
        # Retrying cannot fix a bad input: fail now, with what to change.
        raise AirflowFailException(str(err)) from None
    return cfg.model_dump(mode="json")


def prepare_data(ti, **_: Any) -> dict:
    from mlm_tasks.prepare import prepare_data as step

    try:
        return step(_config(ti))
    except ConfigError as err:
        from airflow.exceptions import AirflowFailException

        raise AirflowFailException(str(err)) from None


def train_local(ti, run_id: str, **_: Any) -> dict:
    from mlm_tasks.train import train

    return train(_config(ti), run_id, _fingerprint(ti))


def evaluate(ti, run_id: str, **_: Any) -> dict:
    from mlm_tasks.evaluate import evaluate as step

    return step(_config(ti), run_id, _fingerprint(ti))


def fill_mask(ti, run_id: str, **_: Any) -> list[dict]:
    from mlm_tasks.infer import fill_mask as step

    return step(_config(ti), run_id)


def summarize(ti, run_id: str, **_: Any) -> dict:
    """Last task: one readable summary of the run in the log, and as XCom for the UI."""
    from mlm_tasks.summary import run_summary

    from mlm_tasks import storage
    from mlm_tasks.paths import RunPaths, join

    cfg = _config(ti)
    summary = run_summary(cfg, run_id, ti.xcom_pull(task_ids="prepare_data"))
    storage.write_text(join(RunPaths(cfg.output_root, run_id).root, "summary.txt"), summary["text"] + "\n")
    log.info("Run summary:\n%s", summary["text"])
    return summary
