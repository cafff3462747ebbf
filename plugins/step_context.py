"""What every Airflow task of a step does first: the run's config from the validated XCom value, the
run's GCP connection installed for gs:// and TPU clients, and the step's `RunContext`.

    cfg, ctx = step_context(config, data)     # config: validate's return value; data: merge_shards'

The values come in as the task's arguments (XComArgs wired in the DAG), never pulled by task id.
"""
from __future__ import annotations

from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext


def step_context(config: dict | PipelineConfig, data: dict | None = None,
                 run_id: str | None = None) -> tuple[PipelineConfig, RunContext]:
    from gcp_credentials import install_for

    cfg = config if isinstance(config, PipelineConfig) else PipelineConfig.model_validate(config)
    install_for(cfg)  # gs:// and TPU clients of this task use the run's GCP connection
    return cfg, RunContext.of(cfg, run_id or _current_run_id(), (data or {}).get("fingerprint"))


def _current_run_id() -> str:
    from airflow.sdk import get_current_context

    context: Any = get_current_context()
    return context["run_id"]
