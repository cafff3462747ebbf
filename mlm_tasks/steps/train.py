"""Step train: train the masked LM, resumably, on CPU, GPU or TPU with the same code (docs/operations.md).
python -m mlm_tasks train --config configs/default.yaml --run-id my-run --data-fingerprint FP"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from mlm_tasks import storage
from mlm_tasks.config import PipelineConfig
from mlm_tasks.paths import RunContext
from mlm_tasks.results import TrainSummary
from mlm_tasks.training.finish import finish, save_model
from mlm_tasks.training.hooks import CheckpointCallback, TrainHook, hooks_from_env
from mlm_tasks.training.loop import TrainLoop
from mlm_tasks.training.plan import load_inputs, plan_training
from mlm_tasks.training.state import build_training

log = logging.getLogger(__name__)


def train(
    cfg: PipelineConfig,
    ctx: RunContext,
    *,
    on_checkpoint: Callable[[int, str], None] | None = None,
    hub_token: str | None = None,
    hub_endpoint: str | None = None,
    hooks: Sequence[TrainHook] = (),
) -> TrainSummary:
    """Train (or resume) run `ctx.run_id` on shard set `ctx.fingerprint`; the summary, also written to the run.

    `on_checkpoint(step, path)` follows each saved checkpoint (`path`: its prefix) and the final one. With
    `publish.sync_checkpoints` checkpoints go to the Hub with `hub_token` (`hub_endpoint` None: HF_ENDPOINT or
    huggingface.co). `hooks` (mlm_tasks/training/hooks.py) run before the ones MLM_TRAIN_HOOKS names."""
    from mlm_tasks.hub import sync as hub_sync

    hub_sync.check_sync_settings(cfg, hub_token)  # a missing token fails now, not after the data checks
    hooks = [*hooks, *hooks_from_env()]  # a bad MLM_TRAIN_HOOKS fails now too
    inputs = load_inputs(cfg, ctx)
    if storage.exists(ctx.run.train_summary):
        done: TrainSummary = storage.read_json(ctx.run.train_summary)
        log.info("Run %s already finished training (%d steps): nothing to do", ctx.run_id, done["steps"])
        return done
    plan = plan_training(cfg, ctx.run, inputs)
    sync = hub_sync.hub_checkpoint_sync(  # None unless publish.sync_checkpoints (and on worker 0)
        cfg,
        hub_token,
        train_records=inputs.shard_set.records("train"),
        global_batch=plan.global_batch,
        total_steps=plan.total_steps,
        strategy=plan.strategy,
        endpoint=hub_endpoint,
    )
    # The sync first (finish: the final upload): a caller's on_checkpoint then sees a checkpoint already queued.
    callbacks = [
        *([CheckpointCallback(sync, end=sync.finish)] if sync else []),
        *([CheckpointCallback(on_checkpoint)] if on_checkpoint else []),
    ]
    state = build_training(cfg, ctx.run, inputs, plan)
    if sync:  # each synced step is also a loadable model, the revision step-N
        sync.save_model = lambda folder: save_model(state.model, inputs.tokenizer, folder)
    loop = TrainLoop(cfg, ctx.run, inputs, plan, state, [*callbacks, *hooks])
    with loop.status:  # runs/<run>/train/status.json: heartbeats while this runs, then done or failed
        loop.run()
        summary = finish(cfg, ctx, inputs, plan, state, loop)
    cost_text = f", ${summary['cost_usd']:,.2f}" if summary["cost_usd"] is not None else ""
    log.info(
        "Training done: %d steps in %.0fs (%.0f tokens/s, %s%s), loss %.3f -> %.3f; model at %s",
        loop.total,
        summary["elapsed_s"],
        summary["tokens_per_s"] or 0,
        summary["mfu_of"],
        cost_text,
        summary["first_loss"] or float("nan"),
        summary["last_loss"] or float("nan"),
        ctx.run.model,
    )
    return summary
