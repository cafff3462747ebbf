"""Every setting of the pipeline, validated, a module per section behind one front (docs/configuration.md).

cfg = load_config("configs/tiny.yaml", overrides={"train.steps": 50})
cfg = config_from_params(dag_params)        # flat names from the Airflow trigger form"""

from mlm_tasks.config.data import MAX_PARTITIONS as MAX_PARTITIONS
from mlm_tasks.config.data import SPECIAL_TOKENS as SPECIAL_TOKENS
from mlm_tasks.config.data import CorpusConfig as CorpusConfig
from mlm_tasks.config.data import DedupConfig as DedupConfig
from mlm_tasks.config.data import FilterConfig as FilterConfig
from mlm_tasks.config.data import ShardConfig as ShardConfig
from mlm_tasks.config.data import TokenizerConfig as TokenizerConfig
from mlm_tasks.config.loading import PARAM_PATHS as PARAM_PATHS
from mlm_tasks.config.loading import build_config as build_config
from mlm_tasks.config.loading import config_from_params as config_from_params
from mlm_tasks.config.loading import load_config as load_config
from mlm_tasks.config.loading import read_yaml_config as read_yaml_config
from mlm_tasks.config.pipeline import PipelineConfig as PipelineConfig
from mlm_tasks.config.release import DownstreamConfig as DownstreamConfig
from mlm_tasks.config.release import DownstreamTask as DownstreamTask
from mlm_tasks.config.release import GateConfig as GateConfig
from mlm_tasks.config.tpu import TpuConfig as TpuConfig
from mlm_tasks.config.training import TrainConfig as TrainConfig
