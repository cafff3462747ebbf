"""Step train: train the masked LM, resumably, on CPU, GPU or TPU with the same code.

    python -m mlm_tasks train --config configs/default.yaml --run-id my-run --data-fingerprint FP

The model is built inside the strategy's scope (TPUStrategy on a TPU VM, Mirrored on several GPUs,
the default strategy on CPU; `train.strategy=mirrored` runs the TPU's strategy.run path on one CPU).
A checkpoint (weights, optimizer moments, step; the learning-rate schedule follows the optimizer's
step) is written every `checkpoint_every` steps; a rerun of the same run restores the latest one and
skips the batches it already consumed, so a killed process loses at most one checkpoint interval and
finishes at exactly the configured step count.

With `model.init_from` the model is the base's (its config.json, the run's dropout) and starts from its
weights (mlm_tasks/model/init_weights.py), read at the revision the shard set recorded; warmup and
learning rate are the run's own. A resumed run restores its checkpoint instead.
"""
from __future__ import annotations

import logging
import os
import platform
import tempfile
from collections.abc import Callable

from mlm_tasks import storage
from mlm_tasks.base_model import BaseModel
from mlm_tasks.config import PipelineConfig
from mlm_tasks.data.shard_set import load_manifest
from mlm_tasks.errors import ConfigError
from mlm_tasks.model.progress import ProgressLog, best_so_far, read_history, write_history
from mlm_tasks.model.status import StatusRecord
from mlm_tasks.model.training_plan import check_resumable, plan_steps
from mlm_tasks.paths import RunContext, RunPaths, join
from mlm_tasks.results import TrainSummary

log = logging.getLogger(__name__)


def select_device(requested: str) -> str:
    if requested != "auto":
        return requested
    # TPU VMs expose their chips as /dev/accel* (v2-v4) or /dev/vfio/* (v5e and later).
    if any(n.startswith("accel") for n in os.listdir("/dev")) or os.path.isdir("/dev/vfio"):
        return "tpu"
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def tpu_resolver_args(cfg: PipelineConfig) -> dict:
    """TPUClusterResolver arguments. TensorFlow on TPU is single-client: on one host the program
    talks to its own chips (`tpu="local"`); on a multi-host slice it runs on worker 0 only and
    addresses the whole slice by node name, zone and project (the remote step exports MLM_TPU_NODE
    exactly then), while the `-pod` runtime on the other hosts serves it."""
    node = os.environ.get("MLM_TPU_NODE")
    if not node:
        return {"tpu": "local"}
    return {"tpu": node, "zone": cfg.tpu.zone, "project": cfg.tpu.project or None}


def make_strategy(device: str, cfg: PipelineConfig | None = None):
    import tensorflow as tf

    if device == "tpu":
        if cfg is not None and cfg.train.strategy == "mirrored":
            raise ConfigError("train.strategy=mirrored is for CPU and GPU; a TPU always trains with "
                              "TPUStrategy: set train.strategy=auto.")
        args = tpu_resolver_args(cfg) if cfg is not None else {"tpu": "local"}
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(**args)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        log.info("TPU system %s: %d replica(s) in sync", args["tpu"], strategy.num_replicas_in_sync)
        return strategy
    if cfg is not None and cfg.train.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()  # over every GPU, else the CPU: one replica
    if device == "gpu" and len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def train(cfg: PipelineConfig, ctx: RunContext, *, on_checkpoint: Callable[[int, str], None] | None = None,
          hub_token: str | None = None, hub_endpoint: str | None = None) -> TrainSummary:
    """Train (or resume) run `ctx.run_id` on the shard set `ctx.fingerprint`; returns the training
    summary (also written to the run's folder).

    `on_checkpoint(step, path)` is called after each saved checkpoint (`path`: its prefix, e.g.
    .../checkpoints/ckpt-40) and at the end with the final one; a hook with an int `checkpoint_every`
    attribute also gets a checkpoint saved every that many steps. With `publish.sync_checkpoints`, train
    adds the Hub sync hook of `mlm_tasks.hub.sync`, which uploads with `hub_token` to `hub_endpoint`
    (None: HF_ENDPOINT or huggingface.co).
    """
    from mlm_tasks.hub import sync as hub_sync

    hub_sync.check_sync_settings(cfg, hub_token)  # a missing token fails now, not after the data checks

    import tensorflow as tf
    import tf_keras

    from mlm_tasks.data.input import damaged_shard_error, mlm_dataset
    from mlm_tasks.data.tokenizer import load_tokenizer
    from mlm_tasks.model.budget import budgeted_steps, seconds_per_step
    from mlm_tasks.model.flops import device_peak, flops_per_token, mfu
    from mlm_tasks.model.precision import auto_precision
    from mlm_tasks.model.roberta import build_model, model_vocab_size, optimizer_and_schedule, roberta_config
    from mlm_tasks.model.training_plan import crossed, steps_per_call
    from mlm_tasks.model.validation import Validation, validation_batches

    run, run_id, fingerprint = ctx.run, ctx.run_id, ctx.data.fingerprint
    shard_set = load_manifest(cfg, fingerprint)
    paths = shard_set.paths
    shard_set.verify("train")
    tokenizer = load_tokenizer(paths.tokenizer, shard_set.max_length)
    base = BaseModel.pinned(cfg, shard_set.base_model)  # None: from random weights
    check_resumable(run, fingerprint, model_vocab_size(cfg, len(tokenizer)))
    if storage.exists(run.train_summary):
        done: TrainSummary = storage.read_json(run.train_summary)
        log.info("Run %s already finished training (%d steps): nothing to do", run_id, done["steps"])
        return done

    device = select_device(cfg.train.device)
    precision = cfg.train.mixed_precision
    if precision == "auto":
        precision = auto_precision(device)
    if precision == "bf16":
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    xla = cfg.train.xla == "on" or (cfg.train.xla == "auto" and device != "cpu")
    tf.keras.utils.set_random_seed(cfg.train.seed)
    strategy = make_strategy(device, cfg)
    replicas = strategy.num_replicas_in_sync  # what the hardware gives, never a number from a config
    global_batch = cfg.train.batch_size * replicas
    total_steps = plan_steps(cfg, shard_set, global_batch)
    per_call = steps_per_call(cfg.train.steps_per_call, device)

    def train_batches(input_context, skip: int, take: int):  # once per input pipeline (host): its own share
        return mlm_dataset(shard_set, "train", tokenizer, global_batch, mlm_probability=cfg.train.mlm_probability,
                           seed=cfg.train.seed, shuffle_buffer=cfg.train.shuffle_buffer, skip_batches=skip,
                           take_batches=take, input_context=input_context)

    model_config = roberta_config(cfg, len(tokenizer), shard_set.special_ids, base.config() if base else None)

    def model_and_optimizer(steps: int):  # in the strategy's scope: variables on its devices
        with strategy.scope():
            built = build_model(model_config, sinusoidal_positions=cfg.model.sinusoidal_init and base is None)
            return built, *optimizer_and_schedule(cfg.train, steps)

    max_pred = cfg.train.max_predictions_per_seq
    if cfg.train.budget_minutes:
        def measure() -> tuple[float, float]:  # a throwaway model, on the run's first batches (the input repeats)
            return seconds_per_step(strategy, model_and_optimizer(total_steps)[:2], step_functions, max_pred, xla,
                                    lambda context: train_batches(context, 0, 10**6), per_call)

        total_steps = budgeted_steps(run, cfg.train.budget_minutes, total_steps if cfg.train.steps else None, measure)
        tf.keras.utils.set_random_seed(cfg.train.seed)  # the run's model starts where a run of that count would
    warmup = int(total_steps * cfg.train.warmup_fraction)
    log.info("Training on %s (%s): %d replica(s), global batch %d, %d steps (%d per call), warmup %d, XLA %s, "
             "precision %s", device, type(strategy).__name__, replicas, global_batch, total_steps, per_call, warmup,
             "on" if xla else "off", precision)
    # None unless publish.sync_checkpoints (and on worker 0)
    sync = hub_sync.hub_checkpoint_sync(cfg, hub_token, train_records=shard_set.records("train"),
                                        global_batch=global_batch, total_steps=total_steps,
                                        strategy=strategy, endpoint=hub_endpoint)
    hooks = [hook for hook in (on_checkpoint, sync) if hook is not None]
    save_every = [cfg.train.checkpoint_every,
                  *(every for hook in hooks if (every := getattr(hook, "checkpoint_every", None)))]

    model, optimizer, schedule = model_and_optimizer(total_steps)
    with strategy.scope():
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = tf.train.CheckpointManager(ckpt, run.checkpoints, max_to_keep=2)
    eval_every = cfg.train.eval_every or 0  # 0: no validation during training
    validate = Validation(strategy, model, validation_batches(shard_set, tokenizer, cfg)) if eval_every else None
    keep_best = cfg.train.keep_checkpoint == "best"
    best_manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run.train_best, max_to_keep=1)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log.info("Resumed from %s at step %d", manager.latest_checkpoint, int(step_var.numpy()))
    elif base is not None:
        from mlm_tasks.model.init_weights import load_base_weights

        with tempfile.TemporaryDirectory() as tmp:
            read = load_base_weights(model, base.local_folder(tmp))
        log.info("Starting from the base model %s at %s: %s", base.uri, base.identity()["revision"], read)
    start_step = int(step_var.numpy())  # int() refuses the Mirrored/TPU variable a strategy makes
    history = [h for h in read_history(run) if h["step"] <= start_step]

    iterator = iter(strategy.distribute_datasets_from_function(
        lambda context: train_batches(context, start_step, total_steps - start_step)))

    distributed_steps = step_functions(strategy, model, optimizer, max_pred, xla)

    per_token = flops_per_token(model.config, shard_set.max_length, max_pred)
    peak = device_peak(device, precision, replicas, cfg.tpu.accelerator_type)
    log.info("%.1f MFLOP per token (training); peak %s", per_token / 1e6, peak.describe())
    status = StatusRecord(run, total_steps=total_steps, start_step=start_step, heartbeat_s=cfg.train.heartbeat_s)
    progress = ProgressLog(history, start_step, total_steps, cfg.train.log_every,
                           global_batch * shard_set.max_length, run.tensorboard, schedule, on_line=status.progress,
                           flops_per_token=per_token, peak_flops=peak.total)
    with status:  # runs/<run>/train/status.json: heartbeats while this runs, then done or failed with its exit code
        def save_checkpoint(step: int) -> None:
            path = manager.save(checkpoint_number=step)
            write_history(run, history)
            for hook in hooks:
                hook(step, path)  # the Hub sync queues the upload and returns at once

        step = start_step
        while step < total_steps:
            first, step = step + 1, min(step + per_call, total_steps)
            try:
                sums = distributed_steps(iterator, step - first + 1).numpy()
            except tf.errors.DataLossError as err:  # a record failed its checksum: the same bytes fail every retry
                bad = damaged_shard_error(shard_set, "train", err)
                if bad is None:
                    raise
                raise bad from None
            # Validation, checkpoints and the fault land on the call's last step (on multiples of steps_per_call).
            due = bool(eval_every) and (crossed(eval_every, first, step) or step == total_steps)
            for s, row in enumerate(sums, start=first):
                progress.record(s, *row, force=due and s == step)
            if first == start_step + 1:
                progress.compiled(step)  # the first call traced and compiled: throughput counts from here
            step_var.assign(step)
            if validate is not None and due and progress.validation(step, *validate()[:2]) and keep_best:
                best_manager.save(checkpoint_number=step)  # a new best: its weights, numbered by its step
            if step != total_steps and any(crossed(every, first, step) for every in save_every):
                save_checkpoint(step)
            fault = cfg.train.fail_at_step
            if fault is not None and first <= fault <= step and not storage.exists(run.fault_marker):
                storage.write_text(run.fault_marker, f"fault injected at step {fault}\n")
                raise RuntimeError(f"Injected fault at step {fault} (train.fail_at_step, raised after step {step}): "
                                   "a retry resumes from the last checkpoint.")
        progress.finish_loop()
        save_checkpoint(total_steps)
        if sync:
            sync.finish()  # the final upload; a failure is logged, the checkpoints stay in output_root
        best = best_so_far(history)
        if keep_best and best is not None and best[0] != total_steps:
            # After the final checkpoint (a resume must continue from the last step, not the best).
            tf.train.Checkpoint(model=model).restore(join(run.train_best, f"ckpt-{best[0]}")).expect_partial()
            log.info("Keeping the best step's model (train.keep_checkpoint=best): step %d, validation loss %.4f",
                     *best)
        _save_model(model, tokenizer, run)
        hours, cost, basis = _tpu_cost(cfg, device, progress.elapsed_s)
        summary: TrainSummary = {
            "steps": total_steps, "resumed_from_step": start_step, "global_batch": global_batch, "replicas": replicas,
            "device": device, "xla": xla, "precision": precision, "steps_per_call": per_call,
            "tokens_per_s": progress.tokens_per_s,
            "first_loss": progress.first_loss, "last_loss": progress.last_loss, "elapsed_s": progress.elapsed_s,
            "data_fingerprint": fingerprint,
            "val_loss": next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None),
            "best_step": best[0] if best else None, "best_val_loss": best[1] if best else None,
            "kept": "best" if keep_best and best else "last",
            "flops_per_token": per_token, "peak_flops": peak.total,
            "mfu": (utilisation := mfu(progress.tokens_per_s, per_token, peak)), "mfu_of": peak.describe(utilisation),
            "accelerator_hours": hours, "cost_usd": cost, "cost_basis": basis,
            "parameters": int(sum(v.shape.num_elements() for v in model.trainable_variables)),
            "tensorflow": tf.__version__, "python": platform.python_version()}
        storage.write_json(run.train_summary, summary)  # last: marks training complete
    cost_text = f", ${summary['cost_usd']:,.2f}" if summary["cost_usd"] is not None else ""
    log.info("Training done: %d steps in %.0fs (%.0f tokens/s, %s%s), loss %.3f -> %.3f; model at %s",
             total_steps, summary["elapsed_s"], summary["tokens_per_s"] or 0, summary["mfu_of"], cost_text,
             summary["first_loss"] or float("nan"),
             summary["last_loss"] or float("nan"), run.model)
    return summary


def step_functions(strategy, model, optimizer, max_pred: int, xla: bool):
    """`distributed_steps(iterator, k)`: k optimizer steps in one call (train.steps_per_call). The loop runs
    on the device side, so the host dispatches once per k steps; it returns each step's [loss sum, masked
    tokens, correct] (k x 3)."""
    import tensorflow as tf

    from mlm_tasks.model.roberta import masked_lm_loss

    replicas = strategy.num_replicas_in_sync
    # Without XLA off a TPU, shapes may change per batch: the LM head then runs at the masked positions
    # only, with no padding slots (same loss; on the embedded default ~1.2x the tokens/s).
    packed = not xla and not isinstance(strategy, tf.distribute.TPUStrategy)

    @tf.function(jit_compile=xla)
    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss_sum, count, correct = masked_lm_loss(model, batch, max_pred, training=True, packed=packed)
            loss = loss_sum / tf.maximum(count, 1.0) / replicas
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
        return loss_sum, count, correct

    @tf.function
    def distributed_steps(it, k: int):
        sums = tf.TensorArray(tf.float32, size=k)
        for i in tf.range(k):
            per_replica = strategy.run(replica_step, args=(next(it),))
            sums = sums.write(i, tf.stack([strategy.reduce("SUM", v, axis=None) for v in per_replica]))
        return sums.stack()

    return distributed_steps


def _tpu_cost(cfg: PipelineConfig, device: str, elapsed_s: float) -> tuple[float | None, float | None, str | None]:
    """(hours, US$, basis) of the training on a TPU at the run's price (tpu.price_per_chip_hour or the list
    price); the VM's start and the steps around training are not in it. Nothing to count off a TPU."""
    if device != "tpu":
        return None, None, None
    from mlm_tasks.tpu import prices

    basis = f"{cfg.tpu.accelerator_type} {'Spot' if cfg.tpu.spot else 'on-demand'}, {prices.source(cfg.tpu)}"
    return elapsed_s / 3600, prices.cost(cfg.tpu, elapsed_s), basis


def _save_model(model, tokenizer, run: RunPaths) -> None:
    import tf_keras

    from mlm_tasks.model.pt_export import export_pytorch_weights

    # Saved in float32 whatever the training precision, so any CPU can load it.
    tf_keras.mixed_precision.set_global_policy("float32")
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        export_pytorch_weights(tmp)  # model.safetensors: what PyTorch / transformers 5.x users load
        tokenizer.save_pretrained(tmp)
        storage.upload_dir(tmp, run.model)


