"""Where a run trains: the accelerator this host has, and the tf.distribute strategy over it.

device = select_device(cfg.train.device)     # tpu, gpu or cpu (train.device=auto: what this host has)
strategy = make_strategy(device, cfg)        # TPUStrategy, Mirrored on several GPUs, else the default
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mlm_tasks.config import PipelineConfig
from mlm_tasks.errors import ConfigError

log = logging.getLogger("mlm_tasks.steps.train")


def select_device(requested: str) -> str:
    if requested != "auto":
        return requested
    # TPU VMs expose their chips as /dev/accel* (v2-v4) or /dev/vfio/* (v5e and later).
    if any(n.startswith("accel") for n in os.listdir("/dev")) or os.path.isdir("/dev/vfio"):
        return "tpu"
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def tpu_resolver_args(cfg: PipelineConfig) -> dict:
    """TPUClusterResolver arguments: this host's chips, or on a multi-host slice (the remote step exports
    MLM_TPU_NODE) the whole slice by name, from worker 0 (TensorFlow on TPU is single-client)."""
    node = os.environ.get("MLM_TPU_NODE")
    return {"tpu": node, "zone": cfg.tpu.zone, "project": cfg.tpu.project or None} if node else {"tpu": "local"}


def make_strategy(device: str, cfg: PipelineConfig) -> Any:
    import tensorflow as tf

    if device == "tpu":
        if cfg.train.strategy == "mirrored":
            raise ConfigError(
                "train.strategy=mirrored is for CPU and GPU; a TPU always trains with "
                "TPUStrategy: set train.strategy=auto."
            )
        args = tpu_resolver_args(cfg)
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(**args)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        log.info("TPU system %s: %d replica(s) in sync", args["tpu"], strategy.num_replicas_in_sync)
        return strategy
    if cfg.train.strategy == "mirrored" or (device == "gpu" and len(tf.config.list_physical_devices("GPU")) > 1):
        return tf.distribute.MirroredStrategy()  # over every GPU, else the CPU: one replica
    return tf.distribute.get_strategy()
