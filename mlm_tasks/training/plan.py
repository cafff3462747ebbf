"""What a training run will do, checked before it starts (validate, check_run and train share it).

steps = plan_steps(cfg, shard_set, global_batch)          # the batch fits the train records
check_resumable(run, fingerprint, shard_set.vocab_size)   # a checkpoint of this run is of this data
inputs = load_inputs(cfg, ctx)                 # TrainInputs: the checked shard set, tokenizer, base model
plan = plan_training(cfg, ctx.run, inputs)     # TrainPlan: device, precision, strategy, batch, steps
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from mlm_tasks import storage
from mlm_tasks.base_model import BaseModelRef
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import ShardSet, load_manifest
from mlm_tasks.data.tokenizer import load_tokenizer
from mlm_tasks.errors import ConfigError, MissingArtifactError
from mlm_tasks.model.cpu_peak import cpu_info
from mlm_tasks.model.flops import device_peak, flops_per_token
from mlm_tasks.model.roberta import model_config, model_vocab_size
from mlm_tasks.paths import RunContext, RunPaths, join
from mlm_tasks.tpu import prices
from mlm_tasks.training.budget import MEASURE_SHARE, budgeted_steps, seconds_per_step
from mlm_tasks.training.device import make_strategy, select_device
from mlm_tasks.training.step import model_and_optimizer, step_functions, train_input

train_log = logging.getLogger("mlm_tasks.steps.train")  # the train step's own lines, as its other parts write them


def checkpoint_vocab_size(checkpoint_dir: str) -> int | None:
    """Rows of the word-embedding matrix in the latest checkpoint under `checkpoint_dir` (None: none yet)."""
    if not storage.exists(join(checkpoint_dir, "checkpoint")):
        return None
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(checkpoint_dir)
    # The word embeddings ([vocab, hidden]): TFRobertaEmbeddings' `weight`, ModernBERT's `tok_embeddings`.
    keys = tuple(f"{v}/.ATTRIBUTES/VARIABLE_VALUE" for v in ("roberta/embeddings/weight", "/tok_embeddings/embeddings"))
    for name, shape in tf.train.list_variables(latest) if latest else []:
        if name.endswith(keys):
            return int(shape[0])
    return None


def check_resumable(run: RunPaths, fingerprint: str, vocab_size: int) -> None:
    """Refuse a run whose earlier work (summary, checkpoint) comes from other data: resuming it would fail deep
    in TensorFlow or, same vocabulary size, silently mean nonsense."""
    summary = storage.read_json_if_exists(run.train_summary)
    if summary and summary.get("data_fingerprint", fingerprint) != fingerprint:
        raise ConfigError(
            f"Run {run.run_id} already trained on data {summary['data_fingerprint']}, not "
            f"{fingerprint}: use a new run id for other data, or the run's own fingerprint."
        )
    found = checkpoint_vocab_size(run.checkpoints)
    if found is not None and found != vocab_size:
        raise ConfigError(
            f"The checkpoint in {run.checkpoints} has a vocabulary of {found} but the tokenizer "
            f"of data {fingerprint} has {vocab_size}: the model and tokenizer vocab sizes differ. "
            "Use a new run id, or delete the checkpoints to start over with this data."
        )


def plan_steps(cfg: PipelineConfig, shard_set: ShardSet, global_batch: int) -> int:
    """The run's step count (train.steps, or epochs over the train records), once the batch fits them."""
    records = shard_set.records("train")
    if global_batch > records:
        raise ConfigError(
            f"Global batch {global_batch} is larger than the {records} train records: lower batch_size or add data."
        )
    return cfg.train.steps or max(1, math.ceil(cfg.train.epochs * records / global_batch))


# steps_per_call "auto": on CPU a call per step costs nothing; on an accelerator a small step takes the host's dispatch.
AUTO_STEPS_PER_CALL = {"cpu": 1, "gpu": 16, "tpu": 64}


def steps_per_call(setting: int | str, device: str) -> int:
    """Optimizer steps per call of the compiled training loop on `device` (cpu, gpu or tpu); bench_gpu.py's too."""
    return AUTO_STEPS_PER_CALL[device] if setting == "auto" else int(setting)


def crossed(every: int, first: int, last: int) -> bool:
    """Whether steps first..last (one call of the loop) hold a multiple of `every`."""
    return every > 0 and last // every > (first - 1) // every


def planned_replicas(cfg: PipelineConfig) -> int:
    """Replicas the run will train on, as far as the config tells: a TPU slice's chips, else 1."""
    return prices.chips(cfg.tpu.accelerator_type) if cfg.compute == "tpu_vm" else 1


def plan_lines(
    cfg: PipelineConfig,
    steps: int,
    vocab_size: int,
    base_config: dict[str, Any] | None = None,
    replicas: int | None = None,
) -> list[str]:
    """What the run will cost, before it spends: tokens, steps and FLOPs; on a TPU VM the hours at
    ASSUMED_MFU of the slice's peak and their price on-demand and Spot."""
    replicas = replicas or planned_replicas(cfg)
    dims = base_config or {
        **cfg.model.shape().model_dump(),
        "vocab_size": vocab_size,
        "model_type": cfg.model.architecture,
        "local_attention": cfg.model.local_attention,
    }
    per_token = flops_per_token(dims, cfg.shards.max_length, cfg.train.max_predictions_per_seq)
    tokens = steps * cfg.train.batch_size * replicas * cfg.shards.max_length
    lines = [
        f"Plan: {steps:,} steps × global batch {cfg.train.batch_size * replicas} × {cfg.shards.max_length} tokens = "
        f"{tokens:,} tokens; {per_token / 1e6:,.1f} MFLOP per token, {tokens * per_token:.3g} FLOP in all."
    ]
    if cfg.train.budget_minutes:
        cap = f"at most {cfg.train.steps:,}" if cfg.train.steps else "no cap"
        lines.append(
            f"train.budget_minutes={cfg.train.budget_minutes:g}: train plans the step count from its measured step "
            f"time and re-plans it as it trains, to stop on time ({cap}); the figures here are for {steps:,} steps."
        )
    if cfg.compute == "tpu_vm":
        peak = device_peak("tpu", "bf16", replicas, cfg.tpu.accelerator_type).per_device
        if peak is None:
            return [*lines, f"No bf16 peak for {cfg.tpu.accelerator_type} in mlm_tasks/model/flops.py: no estimate."]
        hours = tokens * per_token / (replicas * peak * prices.ASSUMED_MFU) / 3600
        rates = {"on-demand": prices.hourly(cfg.tpu, False), "Spot": prices.hourly(cfg.tpu, True)}
        costs = [f"{kind} ${rate * hours:,.2f} (${rate:,.2f}/h)" for kind, rate in rates.items() if rate is not None]
        lines.append(
            f"Estimate on {cfg.tpu.accelerator_type} ({replicas} chips × {peak / 1e12:.0f} TFLOP/s bf16) at "
            f"{100 * prices.ASSUMED_MFU:.0f}% MFU: {hours:.2f} h of training; {', '.join(costs) or 'no price known'} "
            f"[{prices.source(cfg.tpu)}], plus the VM's start and the steps around training."
        )
    return lines


@dataclass(frozen=True)
class TrainInputs:
    """What a run trains on: its shard set (train split verified), its tokenizer, and the base model or the
    checkpoint of train.continue_run it starts from (None, None: random weights)."""

    shard_set: ShardSet
    tokenizer: Any
    base: BaseModelRef | None
    continued: str | None = None  # the checkpoint path


def load_inputs(cfg: PipelineConfig, ctx: RunContext) -> TrainInputs:
    """The run's shard set, tokenizer and base model, once the shards pass their checksums and the run's
    earlier checkpoint (if any) fits this data."""
    shard_set = load_manifest(cfg, ctx.data.fingerprint)
    shard_set.verify("train")
    tokenizer = load_tokenizer(shard_set.paths.tokenizer, shard_set.max_length)
    base = BaseModelRef.pinned(cfg, shard_set.base_model)  # at the revision the shard set recorded
    vocab_size = model_vocab_size(cfg, len(tokenizer))
    check_resumable(ctx.run, ctx.data.fingerprint, vocab_size)
    return TrainInputs(shard_set, tokenizer, base, continued_checkpoint(cfg, ctx.data.fingerprint, vocab_size))


def continued_checkpoint(cfg: PipelineConfig, fingerprint: str, vocab_size: int) -> str | None:
    """The latest checkpoint of the run train.continue_run names, once found and of this data (None: not set)."""
    if not cfg.train.continue_run:
        return None
    other = RunPaths(cfg.output_root, cfg.train.continue_run)
    if checkpoint_vocab_size(other.checkpoints) is None:
        raise MissingArtifactError(
            f"train.continue_run {cfg.train.continue_run!r} has no checkpoint under {other.checkpoints}: "
            "train that run first (same output_root), or check the run id."
        )
    check_resumable(other, fingerprint, vocab_size)
    import tensorflow as tf

    return str(tf.train.latest_checkpoint(other.checkpoints))


@dataclass(frozen=True)
class TrainPlan:
    """How the run trains on this host, fixed before its model is built."""

    device: str  # cpu, gpu or tpu
    precision: str  # off or bf16 (the global Keras policy is set to match)
    xla: bool
    strategy: Any  # the tf.distribute strategy the model is built in
    replicas: int  # what the hardware gives, never a number from a config
    global_batch: int  # train.batch_size per replica x replicas
    total_steps: int  # train.steps, epochs over the records, or what fits train.budget_minutes
    per_call: int  # optimizer steps per call of the compiled loop
    model_config: Any  # the RobertaConfig or ModernBertConfig the model is built from
    budget: Any = None  # Budget (mlm_tasks/training/budget.py) with train.budget_minutes: the loop re-plans to it
    precision_reason: str = ""  # why this precision: the setting, or `auto`'s rule


def plan_training(cfg: PipelineConfig, run: RunPaths, inputs: TrainInputs) -> TrainPlan:
    """Pick the device, precision and strategy, and fix the batch and the step count (with
    train.budget_minutes, from the measured speed of the run's own step). Seeds the run's RNG."""
    import tensorflow as tf
    import tf_keras

    device = select_device(cfg.train.device)
    xla = cfg.train.xla == "on" or (cfg.train.xla == "auto" and device != "cpu")
    tf.keras.utils.set_random_seed(cfg.train.seed)
    strategy = make_strategy(device, cfg)
    replicas = strategy.num_replicas_in_sync
    global_batch = cfg.train.batch_size * replicas
    total_steps = plan_steps(cfg, inputs.shard_set, global_batch)
    base_config = inputs.base.config() if inputs.base else None
    config = model_config(cfg, len(inputs.tokenizer), inputs.shard_set.special_ids, base_config)
    precision: str = cfg.train.mixed_precision
    reason = f"{precision}: set by train.mixed_precision"
    if precision == "auto":
        precision, reason = auto_precision(device)
        train_log.info("Precision %s", reason)
    per_call = steps_per_call(cfg.train.steps_per_call, device)
    plan = TrainPlan(
        device, precision, xla, strategy, replicas, global_batch, total_steps, per_call, config, precision_reason=reason
    )
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
    if cfg.train.budget_minutes:
        budget = _budget(cfg, run, inputs, plan, cfg.train.budget_minutes)
        plan = replace(plan, total_steps=budget.steps, budget=budget)
    # The measurements' throwaway models drew from the RNG: the run's model starts where a run without them would.
    tf.keras.utils.set_random_seed(cfg.train.seed)
    train_log.info(
        "Training on %s (%s): %d replica(s), global batch %d, %d steps (%d per call), warmup %d, XLA %s, precision %s",
        device,
        type(strategy).__name__,
        replicas,
        global_batch,
        plan.total_steps,
        plan.per_call,
        int(plan.total_steps * cfg.train.warmup_fraction),
        "on" if xla else "off",
        precision,
    )
    return plan


def auto_precision(device: str, flags: set[str] | None = None) -> tuple[str, str]:
    """train.mixed_precision=auto on `device`: (off or bf16, why). bf16 on a TPU or GPU, and on a CPU with bf16
    units (its `flags`, default /proc/cpuinfo's); fp32 where TensorFlow would emulate bf16 (docs/google-cloud.md)."""
    if device != "cpu":
        return "bf16", f"bf16: the {device.upper()}'s matrix units run it natively"
    flags = cpu_info()["flags"] if flags is None else flags
    unit = next((f for f in ("amx_bf16", "avx512_bf16") if f in flags), None)
    if unit:
        return "bf16", f"bf16: this CPU has bf16 units ({unit}), where bf16 trained at least as fast as fp32"
    return "off", "fp32: this CPU has no bf16 units (no amx_bf16 or avx512_bf16), so TensorFlow would emulate bf16"


def _budget(cfg: PipelineConfig, run: RunPaths, inputs: TrainInputs, plan: TrainPlan, minutes: float) -> Any:
    """The step count that fits train.budget_minutes at the start (recorded in RunPaths.train_budget), measured
    on a throwaway model and optimizer in the run's precision, on the run's first batches."""

    def measure() -> tuple[float, float]:
        t = cfg.train
        model, optimizer, _ = model_and_optimizer(
            plan.strategy, cfg, plan.model_config, plan.total_steps, from_base=inputs.base is not None
        )
        run_steps = step_functions(plan.strategy, model, optimizer, t.max_predictions_per_seq, plan.xla, t.clip_norm)
        batches = train_input(cfg, inputs.shard_set, inputs.tokenizer, plan.global_batch, 0, 10**6)
        return seconds_per_step(plan.strategy, run_steps, batches, plan.per_call, MEASURE_SHARE * minutes * 60)

    return budgeted_steps(run, minutes, plan.total_steps if cfg.train.steps else None, measure)
