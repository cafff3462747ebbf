"""Benchmark 9: a better model in the same CPU minutes. Trains the embedded default (configs/default.yaml) for
its wall-time budget under each candidate recipe and under the default itself, alternating, each in a fresh
subprocess, and scores every run by the validation loss on FIXED 15% masks (mlm_tasks/training/validation.py:
the same tokenizer, split, batches and masked positions for every recipe, whatever it trains with).

    .venv/bin/python bench/bench_quality.py [--budget-minutes 5] [--rounds 1]
        [--candidates default,bf16,one_cycle,mask25,vocab128,bf16+one_cycle]   # `a+b`: both recipes at once
        [--config configs/default.yaml]                                        # tests: configs/tiny.yaml
        [--today ../main-before]   # the baseline: another checkout's code and its version of --config
    .venv/bin/python bench/bench_quality.py --commits 7ab6da0^,18e2cc0 --rounds 2   # defaults side by side
    .venv/bin/python bench/bench_quality.py --commits HEAD:long --rounds 3   # a recipe beside the default, 3 seeds
    .venv/bin/python bench/bench_quality.py --commits HEAD:modernbert --rounds 3   # ModernBERT vs RoBERTa, 3 seeds
    .venv/bin/python bench/bench_quality.py --attention [--preset base]   # a ModernBERT layer at 128 and 1,024 tokens

The step count of every run is fixed by train.budget_minutes from its own measured step time, so a faster
recipe trains more steps in the same minutes; the table gives steps done, tokens/s, the validation loss and
its difference to the baseline's (negative: better; the baseline is `today` when given, else `default`).
`in3min` runs a recipe on 3 minutes instead: does it reach the baseline's loss in 60% of its time? Each round
runs the recipes in turn, the order reversed every other round, so drift of a shared machine's load hits all
alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

# Each candidate: the config overrides it trains with (on top of the config file). Off by default until
# measured here; what helps goes into configs/default.yaml (and mixed_precision's auto).
CANDIDATES: dict[str, dict] = {
    "default": {},
    "bf16": {"train.mixed_precision": "bf16"},  # the CPU's bf16 matrix units (AMX / AVX512-BF16)
    # Cramming's budget-tied one-cycle: a higher peak, cosine annealing to 0 at the budget's last step.
    "one_cycle": {"train.schedule": "one_cycle", "train.learning_rate": 0.003, "train.warmup_fraction": 0.1},
    # Wettig et al.: more masking, with prediction slots for it (25% of 128 is 32 on average).
    "mask25": {"train.mlm_probability": 0.25, "train.max_predictions_per_seq": 48},
    "vocab128": {"model.vocab_multiple": 128},  # 8000 -> 8064 embedding rows
    # Smaller batches, more steps from the same tokens: early in training the useful batch is small.
    "batch16": {"train.batch_size": 16},
    "batch8": {"train.batch_size": 8},
    "mask30": {"train.mlm_probability": 0.3, "train.max_predictions_per_seq": 56},
    "mask40": {"train.mlm_probability": 0.4, "train.max_predictions_per_seq": 64},
    # The same recipe on 60% of the default's minutes: does it reach the default's loss in them?
    "in3min": {"train.budget_minutes": 3},
    "lr1e3": {"train.learning_rate": 0.001},
    "lr3e3": {"train.learning_rate": 0.003},
    "lr5e3": {"train.learning_rate": 0.005},
    "lr2e3": {"train.learning_rate": 0.002},
    "warm02": {"train.warmup_fraction": 0.02},
    # The tiny shape (2 layers of 128, 2 heads, FFN 512): four heads of 32, one layer (~1.3x the tokens/s),
    # half the FFN width (~1.1x).
    "heads4": {"model.num_attention_heads": 4},
    "layers1": {"model.num_hidden_layers": 1},
    "layers2": {"model.num_hidden_layers": 2, "train.learning_rate": 0.0015},  # the tiny preset's own shape
    "ffn256": {"model.intermediate_size": 256},
    # ModernBERT's shape (RoPE, GeGLU, pre-norm, no biases) at the default's parameters (1 layer of 128, FFN 512):
    # one layer, GLU 342 wide (3 x 342 ~ 2 x 512 weights per hidden unit). One layer is global: no local window.
    "modernbert": {"model.architecture": "modernbert", "model.num_hidden_layers": 1, "model.intermediate_size": 342},
    # The RoBERTa default before ModernBERT's (configs/default.yaml until phase 9): one post-LN layer, FFN 512.
    "roberta": {"model.architecture": "roberta", "model.intermediate_size": None, "model.sinusoidal_init": True},
    # The default's fixed step count, longer: the minutes make run has left under its 10 (--commits HEAD:long).
    "long": {"train.steps": 4500, "train.budget_minutes": 7.5},
    # The Intel AMX kind's ~6 minutes (issue 46 item 6): 1,650 steps whatever the load, a deadline that does not bind.
    "at1650": {"train.steps": 1650, "train.budget_minutes": 60},
    # The AMD EPYC kind's 4,500 steps, on any kind: quality per step does not depend on the machine.
    "at4500": {"train.steps": 4500, "train.budget_minutes": 60},
    # A higher peak now that train.clip_norm holds it: a short warmup, then a long stable phase (wsd).
    "lr4wsd": {"train.learning_rate": 0.004, "train.schedule": "wsd", "train.warmup_fraction": 0.02},
    "lr3wsd": {"train.learning_rate": 0.003, "train.schedule": "wsd", "train.warmup_fraction": 0.02},
}
SCORING = {"train.eval_every": 10**6, "train.eval_batches": 10**4}  # one validation, at the last step, all of it


def recipe(name: str) -> dict:
    """The overrides of `name`: one candidate, or several joined by `+`."""
    overrides: dict = {}
    for part in name.split("+"):
        if part not in CANDIDATES:
            raise SystemExit(f"Unknown candidate {part!r}: choose from {', '.join(CANDIDATES)} (join with +).")
        overrides.update(CANDIDATES[part])
    return overrides


def load(config: str, budget_minutes: float, name: str = "default"):
    from mlm_tasks.config import load_config

    return load_config(
        config,
        # Steps from the budget alone: the default's train.steps would cap a faster recipe's.
        {
            "output_root": common.BENCH_ROOT,
            "train.budget_minutes": budget_minutes,
            "train.steps": None,
            **SCORING,
            **recipe(name),
        },
    )


def run_recipe(config: str, budget_minutes: float, name: str) -> dict:
    import logging

    import mlm_tasks
    from mlm_tasks.paths import RunContext
    from mlm_tasks.steps import build_shard_set
    from mlm_tasks.steps.train import train

    logging.disable(logging.INFO)
    cfg = load(config, budget_minutes, name)
    data = build_shard_set(cfg)  # cached: prepared by the parent
    began = time.monotonic()
    summary = train(cfg, RunContext.of(cfg, f"quality-{name}-{os.getpid()}-{int(time.time())}", data["fingerprint"]))
    return {
        "steps": summary["steps"],
        "tokens_per_s": summary["tokens_per_s"],
        "val_loss": summary["val_loss"],
        "train_s": time.monotonic() - began,
        "loop_s": summary["elapsed_s"],
        "precision": summary["precision"],
        "mlm_tasks": os.path.dirname(mlm_tasks.__file__),
    }


def attention_cost(preset: str, lengths: tuple[int, ...] = (128, 1024), repeats: int = 5) -> None:
    """One ModernBERT layer of `preset`, global (layer 0) and local (layer 1), forward + backward at each length,
    XLA-compiled, one sequence: the median ms of `repeats`, and the attention-score FLOPs each needs (a local layer:
    its window). The window is a mask on dense scores here, so a local layer computes all of them."""
    import tensorflow as tf

    from mlm_tasks.config.training import MODERNBERT_PRESETS
    from mlm_tasks.model.modernbert import EncoderLayer, attention_biases, layer_types, rope
    from mlm_tasks.model.modernbert_weights import modernbert_config

    shape = MODERNBERT_PRESETS[preset]
    config = modernbert_config({**shape.model_dump(), "num_hidden_layers": 3, "local_attention": 128})
    h, rows = shape.hidden_size, []
    for n in lengths:
        x = tf.random.normal([1, n, h])
        biases = attention_biases(tf.ones([1, n], tf.int32), config)
        for index in (0, 1):
            layer, kind = EncoderLayer(config, index), layer_types(config)[index]
            cos_sin = rope(n, h // shape.num_attention_heads, 10_000.0)

            @tf.function(jit_compile=True)
            def step(x, layer=layer, bias=biases[kind], cos_sin=cos_sin):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(layer(x, bias, *cos_sin, training=True))
                return tape.gradient(loss, [x, *layer.trainable_variables])

            step(x)  # trace and compile
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                [g.numpy() for g in step(x)]
                times.append(1000 * (time.perf_counter() - began))
            needed = 4 * n * (n if kind == "full_attention" else min(n, config.local_attention + 1)) * h
            rows.append([n, kind, common.median(times), min(times), max(times), 3 * needed / 1e6])
    print(f"\n{common.machine()}\nModernBERT preset {preset}: one layer, forward + backward, batch 1, XLA, fp32\n")
    print(common.table(["tokens", "layer", "median ms", "min ms", "max ms", "score MFLOP needed"], rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(common.REPO, "configs", "default.yaml"))
    p.add_argument("--budget-minutes", type=float, default=None, help="default: the config's train.budget_minutes")
    p.add_argument("--candidates", default="default,bf16,one_cycle,mask25,vocab128")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--today",
        metavar="CHECKOUT",
        help="also run recipe `today`: that checkout's code and its own version of --config (e.g. a git "
        "worktree of the commit before a change), the baseline a target is measured against",
    )
    p.add_argument(
        "--commits",
        metavar="REV,...",
        help="instead: this checkout's default beside these commits' own code and default, each trained as its "
        "make run trains it (bench/commit_arms.py), e.g. 7ab6da0^,18e2cc0",
    )
    p.add_argument(
        "--attention", action="store_true", help="instead: a ModernBERT layer's cost at 128 and 1,024 tokens"
    )
    p.add_argument("--preset", default="base", help="with --attention: the ModernBERT preset")
    p.add_argument(
        "--first-seed",
        type=int,
        default=42,
        help="with --commits: round r trains with this seed + r - 1 (split seeds across processes)",
    )
    p.add_argument("--no-head", action="store_true", help="with --commits: the listed arms alone, not HEAD beside them")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.attention:
        return attention_cost(args.preset)
    if args.commits:
        import commit_arms

        return commit_arms.compare(
            args.commits.split(","),
            args.rounds,
            os.path.relpath(args.config, common.REPO),
            first_seed=args.first_seed,
            head=not args.no_head,
        )
    if args.worker:
        name, budget = args.worker.split(":")
        return common.emit(run_recipe(args.config, float(budget), name))

    from mlm_tasks.steps import build_shard_set

    base = load(args.config, 1.0)
    budget = args.budget_minutes if args.budget_minutes is not None else _config_budget(args.config)
    names = args.candidates.split(",")
    for name in names:
        recipe(name)  # an unknown one fails now, not after an hour
    if args.today:
        names.insert(0, "today")  # the baseline
    elif "default" not in names:
        names.insert(0, "default")
    data = build_shard_set(base)  # once, before any timed run
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            res = _run(name, budget, args.config, args.today)
            runs[name].append(res)
            print(
                f"round {rnd + 1} {name}: {res['steps']} steps, {res['tokens_per_s'] or 0:.0f} tokens/s, "
                f"val loss {res['val_loss']:.4f}, {res['wall_s']:.0f} s ({res['mlm_tasks']})",
                file=sys.stderr,
            )
    baseline = "today" if args.today else "default"
    default_loss = common.median([r["val_loss"] for r in runs[baseline]])
    rows = []
    for name in names:
        loss = common.median([r["val_loss"] for r in runs[name]])
        rows.append(
            [
                name,
                int(common.median([r["steps"] for r in runs[name]])),
                float(common.median([r["tokens_per_s"] or 0 for r in runs[name]])),
                runs[name][0]["precision"],
                f"{loss:.4f}",
                f"{loss - default_loss:+.4f}",
                " ".join(f"{r['val_loss']:.3f}" for r in runs[name]),
                float(common.median([r["loop_s"] for r in runs[name]])),
                float(common.median([r["wall_s"] for r in runs[name]])),
            ]
        )
    today = f"; today: {_commit(args.today)}'s code and config, from {args.today}" if args.today else ""
    print(
        f"\n{common.machine()}\n{os.path.relpath(args.config, common.REPO)} at {_commit(common.REPO)}, "
        f"train.budget_minutes={budget:g}{today}; "
        f"data {data['fingerprint']}; validation loss on fixed 15% masks, whole validation split; median of "
        f"{args.rounds} alternating round(s)\n"
    )
    # "loop s": the training loop's own seconds. The budget fixes the step count from a few seconds' measurement,
    # so on a machine whose load changes the loop can end well before or after the budget: read it beside the loss.
    print(
        common.table(
            ["recipe", "steps", "tokens/s", "precision", "val loss", f"vs {baseline}", "per round", "loop s", "wall s"],
            rows,
        )
    )


def _run(name: str, budget: float, config: str, today: str | None) -> dict:
    """One recipe in a fresh process of this checkout (PYTHONPATH: not an installed mlm_tasks), or `today`:
    the other checkout's bench worker, code and its own copy of the config file, on the same bench root."""
    if name == "today":
        assert today is not None
        return common.run_worker(
            os.path.join(today, "bench", "bench_quality.py"),
            f"default:{budget}",
            "--config",
            os.path.join(today, os.path.relpath(config, common.REPO)),
            env={"PYTHONPATH": today},
        )
    return common.run_worker(__file__, f"{name}:{budget}", "--config", config, env={"PYTHONPATH": common.REPO})


def _commit(checkout: str) -> str:
    import subprocess

    found = subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h"], capture_output=True, text=True)
    return found.stdout.strip() or "?"


def _config_budget(config: str) -> float:
    from mlm_tasks.config import load_config

    minutes = load_config(config, {"output_root": common.BENCH_ROOT}).train.budget_minutes
    if minutes is None:
        raise SystemExit(f"{config} has no train.budget_minutes: pass --budget-minutes.")
    return minutes


if __name__ == "__main__":
    main()
