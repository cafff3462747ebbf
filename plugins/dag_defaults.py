"""What every project DAG shares: owner, retries with backoff, the failure notifier, the default
config file and the trigger-form fields, generated from the config model so the form and the
validator cannot disagree on types, bounds, choices or descriptions.

MLM_CONFIG_DIR moves the configs folder (a deployment mounts it elsewhere); MLM_RETRY_DELAY_S lets
tests and local runs retry at once, production keeps 30 s, doubling up to 10 minutes. Every task
goes to the `control` queue unless its DAG puts it on `cpu` (see worker_queues.py).
Every task has an execution_timeout, MLM_TASK_TIMEOUT_H hours (default 6): a task stuck on something
that never answers fails and retries instead of holding its slot for ever. Tasks whose run decides
how long they may take set their own (train: `train.timeout_hours`, see train_operator.py).
"""
from __future__ import annotations

import functools
import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import Param

from failure_notifier import FailureNotifier
from mlm_tasks.config import PARAM_PATHS, PipelineConfig, load_config
from worker_queues import CONTROL_QUEUE

CONFIG_DIR = Path(os.environ.get("MLM_CONFIG_DIR", Path(__file__).resolve().parents[1] / "configs"))
DEFAULT_CONFIG = str(CONFIG_DIR / "default.yaml")


def default_config() -> PipelineConfig:
    """The default config file, parsed: the form's defaults come from it (one source of truth).
    Cached per parse of the DAG folder: both DAGs read it."""
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
        "config_file": Param(DEFAULT_CONFIG, type="string", title="Config file",
                             description="YAML with every setting (see configs/); the fields below override it."),
        "output_root": Param(defaults.output_root, type="string", title="Output root",
                             description=output_root_help),
        "overrides": Param({}, type="object", title="Other settings",
                           description=f"Any other setting by dotted path, e.g. {overrides_example}."),
    }


# JSON-schema keywords the trigger form understands; the rest of pydantic's schema is left out.
_FORM_KEYWORDS = ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items")


@functools.cache
def _config_schema() -> dict:
    """The config's JSON schema, built once: pydantic builds a whole tree on every call (~15 ms)."""
    return PipelineConfig.model_json_schema()


def _json_schema(model: type) -> dict:
    """A section's JSON schema, read from the top-level schema's $defs."""
    tree = _config_schema()
    return tree if model is PipelineConfig else tree["$defs"][model.__name__]


def field_schema(dotted: str) -> dict:
    """The JSON schema of one setting (`tokenizer.vocab_size`), as pydantic derives it from the model.
    An optional setting (`int | None`) becomes `type: [integer, null]` with the integer's bounds."""
    *sections, leaf = dotted.split(".")
    model = PipelineConfig
    for section in sections:
        model = model.model_fields[section].annotation
    prop = _json_schema(model)["properties"][leaf]
    options = prop.get("anyOf", [prop])
    schema: dict = {}
    types = []
    for option in options:
        types.append(option.get("type", "string"))
        schema.update({k: v for k, v in option.items() if k in _FORM_KEYWORDS and k != "type"})
    schema.update({k: v for k, v in prop.items() if k == "enum"})
    schema["type"] = types[0] if len(types) == 1 else types
    return schema


def form_params(defaults: PipelineConfig, titles: dict[str, str]) -> dict:
    """Form fields for flat setting names (config.PARAM_PATHS): `{"vocab_size": "Vocabulary size"}`.
    Type, bounds, choices and description come from the config model; the default from `defaults`."""
    params = {}
    for name, title in titles.items():
        dotted = PARAM_PATHS[name]
        *sections, leaf = dotted.split(".")
        section = defaults
        for part in sections:
            section = getattr(section, part)
        description = type(section).model_fields[leaf].description
        params[name] = Param(getattr(section, leaf), title=title, description=description,
                             **field_schema(dotted))
    return params
