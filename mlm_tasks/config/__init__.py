"""One validated model of every setting of the pipeline, a module per section, behind one front.

    cfg = load_config("configs/tiny.yaml", overrides={"train.steps": 50})
    cfg = config_from_params(dag_params)        # flat names from the Airflow trigger form

Unknown keys are errors, so a typo fails before any work starts. What each setting is for:
docs/configuration.md; the modules: docs/layout.md.
"""

from mlm_tasks.config.data import (
    MAX_PARTITIONS,
    SPECIAL_TOKENS,
    CorpusConfig,
    DedupConfig,
    FilterConfig,
    MixtureSource,
    ShardConfig,
    TokenizerConfig,
)
from mlm_tasks.config.loading import (
    MAX_CONFIG_BYTES,
    PARAM_PATHS,
    build_config,
    config_from_params,
    load_config,
    read_yaml_config,
    split_params,
)
from mlm_tasks.config.pipeline import PipelineConfig, SensorConfig, StorageConfig
from mlm_tasks.config.release import DownstreamConfig, DownstreamTask, GateConfig, PublishConfig
from mlm_tasks.config.tpu import TpuConfig
from mlm_tasks.config.training import EvalConfig, InferConfig, ModelConfig, TrainConfig

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_PARTITIONS",
    "PARAM_PATHS",
    "SPECIAL_TOKENS",
    "CorpusConfig",
    "DedupConfig",
    "DownstreamConfig",
    "DownstreamTask",
    "EvalConfig",
    "FilterConfig",
    "GateConfig",
    "InferConfig",
    "MixtureSource",
    "ModelConfig",
    "PipelineConfig",
    "PublishConfig",
    "SensorConfig",
    "ShardConfig",
    "StorageConfig",
    "TokenizerConfig",
    "TpuConfig",
    "TrainConfig",
    "build_config",
    "config_from_params",
    "load_config",
    "read_yaml_config",
    "split_params",
]
