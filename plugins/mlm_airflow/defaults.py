"""What every project DAG shares: default_args, the default config file, the trigger form (generated from the
config model) and the Celery queues (environment variables, docs/operations.md)."""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Param

from mlm_airflow.notifications import FailureNotifier
from mlm_tasks.config import PARAM_PATHS, PipelineConfig, load_config

CONFIG_DIR = Path(os.environ.get("MLM_CONFIG_DIR", Path(__file__).resolve().parents[2] / "configs"))
DEFAULT_CONFIG = str(CONFIG_DIR / "default.yaml")

CPU_QUEUE = os.environ.get("MLM_CPU_QUEUE", "").strip() or "cpu"
CONTROL_QUEUE = os.environ.get("MLM_CONTROL_QUEUE", "").strip() or "control"

# Executors whose tasks all run on the scheduler's machine; any other may run two tasks of one run on two machines.
SINGLE_MACHINE_EXECUTORS = {"LocalExecutor", "SequentialExecutor", "DebugExecutor"}


def default_config() -> PipelineConfig:
    """The default config file, parsed (cached while the file is unchanged): the forms' defaults come from it."""
    return _default_config(DEFAULT_CONFIG, os.path.getmtime(DEFAULT_CONFIG))


@functools.cache
def _default_config(path: str, mtime: float) -> PipelineConfig:
    return load_config(path)


def default_args() -> dict:
    return {
        "owner": "ml-platform",
        "retries": 2,
        "retry_delay": timedelta(seconds=float(os.environ.get("MLM_RETRY_DELAY_S", 30))),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
        # Longer than any wait the default config asks for (create 30 min, shard gate 1 h, delete 15 min).
        "execution_timeout": timedelta(hours=float(os.environ.get("MLM_TASK_TIMEOUT_H", 6))),
        "on_failure_callback": [FailureNotifier()],
        # Light by default; the DAGs send the CPU-heavy tasks to CPU_QUEUE (CeleryExecutor only).
        "queue": CONTROL_QUEUE,
    }


def config_params(defaults: PipelineConfig, output_root_help: str, overrides_example: str) -> dict:
    """The form fields every DAG has: the config file, output_root and a free `overrides` object."""
    return {
        "config_file": Param(
            DEFAULT_CONFIG,
            type="string",
            title="Config file",
            description="YAML with every setting (see configs/); the fields below override it.",
        ),
        "output_root": Param(defaults.output_root, type="string", title="Output root", description=output_root_help),
        "overrides": Param(
            {},
            type="object",
            title="Other settings",
            description=f"Any other setting by dotted path, e.g. {overrides_example}.",
        ),
    }


# JSON-schema keywords the trigger form understands; the rest of pydantic's schema is left out.
_FORM_KEYWORDS = ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items")
_config_schema = functools.cache(PipelineConfig.model_json_schema)  # pydantic builds it anew on every call


def form_params(defaults: PipelineConfig, titles: dict[str, str]) -> dict:
    """Form fields for flat setting names (config.PARAM_PATHS): `{"vocab_size": "Vocabulary size"}`.
    Type, bounds, choices and description come from the config model; the default from `defaults`."""
    tree, params = _config_schema(), {}
    for name, title in titles.items():
        *sections, leaf = PARAM_PATHS[name].split(".")
        section = defaults
        for part in sections:
            section = getattr(section, part)
        model = type(section)
        prop = (tree if model is PipelineConfig else tree["$defs"][model.__name__])["properties"][leaf]
        description = model.model_fields[leaf].description
        params[name] = Param(getattr(section, leaf), title=title, description=description, **_form_schema(prop))
    return params


def _form_schema(prop: dict) -> dict:
    """One setting's JSON schema as the form takes it: an optional setting (`int | None`) becomes
    `type: [integer, null]` with the integer's bounds."""
    options = prop.get("anyOf", [prop])
    schema = {k: v for option in options for k, v in option.items() if k in _FORM_KEYWORDS and k != "type"}
    schema.update({k: v for k, v in prop.items() if k == "enum"})
    types = [option.get("type", "string") for option in options]
    schema["type"] = types[0] if len(types) == 1 else types
    return schema


def train_queue(default_compute: str) -> str:
    """The queue of train and the steps that judge the model: light when they drive a TPU VM, else CPU. Fixed at
    parse time, so it follows the default config file's compute."""
    return CONTROL_QUEUE if default_compute == "tpu_vm" else CPU_QUEUE


def distributed_executor() -> str | None:
    """The name of the first configured executor that may run tasks on other machines, else None."""
    from airflow.configuration import conf

    for name in conf.get("core", "executor", fallback="LocalExecutor").split(","):
        name = name.strip().split(":")[-1].rsplit(".", 1)[-1]  # alias:module.Class or module.Class
        if name and name not in SINGLE_MACHINE_EXECUTORS:
            return name
    return None


def shared_output_roots() -> list[str]:
    return [p for p in os.environ.get("MLM_SHARED_OUTPUT_ROOTS", "").split(os.pathsep) if p.strip()]
