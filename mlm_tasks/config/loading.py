"""Loading a run's settings: a YAML file, the trigger form's flat names, dotted overrides (see the package's)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlm_tasks.config.pipeline import PipelineConfig
from mlm_tasks.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32  # a config file's settings nest a few levels; a thousand would exhaust the parser's stack


# Flat names used by the Airflow trigger form and `--set`, mapped to their place in the config.
PARAM_PATHS = {
    "output_root": "output_root",
    "compute": "compute",
    "corpus_source": "corpus.source",
    "hf_dataset": "corpus.hf_path",
    "hf_config": "corpus.hf_name",
    "local_paths": "corpus.local_paths",
    "dump_path": "corpus.dump_path",
    "vocab_size": "tokenizer.vocab_size",
    "max_length": "shards.max_length",
    "model_preset": "model.preset",
    "architecture": "model.architecture",
    "init_from": "model.init_from",
    "init_revision": "model.init_revision",
    "steps": "train.steps",
    "budget_minutes": "train.budget_minutes",
    "batch_size": "train.batch_size",
    "learning_rate": "train.learning_rate",
    "tpu_project": "tpu.project",
    "tpu_zone": "tpu.zone",
    "accelerator_type": "tpu.accelerator_type",
    "runtime_version": "tpu.runtime_version",
    "publish": "publish.enabled",
    "hub_repo_id": "publish.repo_id",
    "require_approval": "publish.require_approval",
}


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` (train.steps) in a nested tree; a section given both as one value and by its settings
    (`{"train": 5, "train.steps": 3}`) is a ConfigError naming the key, whichever comes first."""
    *parents, leaf = dotted.split(".")
    node = tree
    for i, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            section = ".".join(parents[: i + 1])
            raise ConfigError(f"Cannot set {dotted!r}: {section!r} is set to {node!r}, not to a section of settings.")
    if isinstance(node.get(leaf), dict) and not isinstance(value, dict):  # pydantic would refuse it, less clearly
        raise ConfigError(f"Cannot set {dotted!r} to {value!r}: it is a section of settings ({sorted(node[leaf])}).")
    node[leaf] = merge(node[leaf], value) if isinstance(node.get(leaf), dict) else value


def nested(settings: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys to a nested tree: {"tpu.zone": z} -> {"tpu": {"zone": z}}."""
    tree: dict[str, Any] = {}
    for key, value in settings.items():
        set_dotted(tree, key, value)
    return tree


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def build_config(base: dict | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Validate `base` (nested dict) with dotted or flat-param `overrides` applied on top."""
    tree = copy.deepcopy(base or {})
    for key, value in (overrides or {}).items():
        dotted = PARAM_PATHS.get(key, key)
        if "." not in dotted and dotted not in PipelineConfig.model_fields:
            raise ConfigError(
                f"Unknown setting {key!r}. Known flat names: {sorted(PARAM_PATHS)}; "
                "or use a dotted path such as train.learning_rate."
            )
        set_dotted(tree, dotted, value)
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            lines.append(f"Unknown setting {where!r}: check its spelling (see configs/default.yaml).")
        elif e["type"] == "value_error" and isinstance(e.get("ctx", {}).get("error"), ConfigError):
            lines.append(str(e["ctx"]["error"]))
        else:
            lines.append(f"{where}: {e['msg']} (got {e.get('input')!r}).")
    return "Invalid configuration:\n  " + "\n  ".join(lines)


def read_yaml_config(path: str | Path) -> dict:
    """Parse a YAML config file strictly: syntax errors, repeated keys, anchors and aliases (a "billion laughs"
    would expand until the task hangs) and a top level that is not a mapping are ConfigErrors naming the line."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        keys: list[Any] = []  # where compose_node is: a mapping's keys and a list's positions

        def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
            key = index.value if isinstance(index, yaml.ScalarNode) else index
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in [*self.keys, key] if k is not None)
                mark = "*" if isinstance(event, yaml.AliasEvent) else "&"
                raise ConfigError(
                    f"{path} line {event.start_mark.line + 1}: {where.lstrip('.') or 'the top level'} uses a YAML "
                    f"anchor or alias ({mark}{event.anchor}): config files may not (an alias can expand to billions "
                    "of values); write the values out."
                )
            if len(self.keys) > MAX_DEPTH:
                raise ConfigError(f"{path} line {event.start_mark.line + 1}: nests deeper than {MAX_DEPTH} levels.")
            self.keys = [*self.keys, key]
            try:
                return super().compose_node(parent, index)
            finally:
                self.keys = self.keys[:-1]

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, int] = {}  # key: its line
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(
                        f"{path} line {key_node.start_mark.line + 1}: key {key!r} is repeated "
                        f"(first at line {seen[key]}): keep one of them."
                    )
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Config file {path} does not exist: see configs/ for examples.")
    # Reading a FIFO would hang the task and /dev/zero fill its memory: a config is a small regular file.
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {path} is not a regular file of at most {MAX_CONFIG_BYTES} bytes: give a YAML "
            "file of settings (see configs/)."
        )
    try:
        tree = yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(
            f"{path}{line} is not valid YAML ({problem}): fix the file (indentation with spaces, `key: value` pairs)."
        ) from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(
            f"{path} holds a YAML {type(tree).__name__}, not a mapping of settings: see "
            "configs/default.yaml for the shape."
        )
    return tree


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Load a YAML config file (or defaults when `path` is None) and apply overrides."""
    return build_config(read_yaml_config(path) if path is not None else {}, overrides)


def split_params(params: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The Airflow form's `config_file`, and the settings it sets: flat fields, then `overrides`."""
    params = dict(params)
    config_file = params.pop("config_file", None) or None
    extra = params.pop("overrides", None) or {}
    if not isinstance(extra, dict):
        raise ConfigError(f'overrides {extra!r} is not a mapping of settings: give e.g. {{"train.steps": 100}}.')
    if not isinstance(config_file, str | None):
        raise ConfigError(f"config_file {config_file!r} is not a path: give the YAML file's path as text.")
    # Form fields left empty mean "keep the file's value".
    flat = {k: v for k, v in params.items() if v is not None and v != ""}
    return config_file, {**flat, **extra}


def config_from_params(params: dict[str, Any]) -> PipelineConfig:
    """Build the config from the Airflow form: `config_file` plus flat params plus `overrides` dict."""
    return load_config(*split_params(params))
