"""Benchmark 8: roberta-base on one GPU, ours (mlm_tasks.steps.train) against the reference `model.fit` loop
(bench_train's), and ours on ModernBERT-base (model.architecture=modernbert, 22 × 768, GLU 1,152), sequence
length 128, bf16, XLA, a fixed number of steps each; prints a Markdown table of tokens/s, MFU, peak device
memory and steps per call, with the machine named, for bench/RESULTS.md.

    .venv/bin/python bench/bench_gpu.py                                 # a GPU machine: the whole benchmark
    .venv/bin/python bench/bench_gpu.py --preset tiny --steps 8 --batch 8 --config configs/tiny.yaml  # CPU check

On a GPU the defaults are the benchmark: model.preset base (vocab from the embedded corpus' tokenizer),
global batch 256, 320 steps of each loop, the first 2 calls of ours' loop (2 × steps_per_call, auto 16 on
GPU: 32 steps) not timed, in either loop (tracing, XLA compilation, tf.data start-up). Bound to 8 minutes
on one GPU with the data preparation (the embedded corpus, once, cached under $MLM_BENCH_ROOT); not yet
measured on a GPU (estimated 3-5 minutes on an H200: two XLA compilations and 2 × 10.5 M tokens); the whole
command's wall time is printed against the bound. With several GPUs it uses the first (CUDA_VISIBLE_DEVICES).

Figures, per loop, each in a fresh subprocess (ours first):
- tokens/s: batch × sequence length × the steps after the warm-up, over their wall time (ours from its
  history entries, one per call; the reference from a fit callback that waits for the device at those two
  steps only).
- MFU: those tokens/s × flops.py's training FLOPs per token over the GPU's dense peak in bf16 (flops.py's
  table, from the GPU's name). Each loop's own count: ours computes the LM head at the 32 masked slots
  of a sequence, the reference at all 128 positions, so the reference's FLOPs per token are higher.
- peak memory: tf.config.experimental.get_memory_info("GPU:0")["peak"] on a GPU (TensorFlow's allocator,
  what XLA's buffers come from too); the subprocess' peak RSS on CPU.
- steps per call: optimizer steps per host dispatch (ours: train.steps_per_call; fit: 1, its default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train
import common

GPU_BATCH = 256  # roberta-base at 128 tokens: large enough to fill an H200's tensor cores, far from its memory
LOOPS = ("ours", "reference", "modernbert")
# The preset's own shape and RoBERTa: the data's config (configs/default.yaml) sets a one-layer ModernBERT for its
# CPU run.
SHAPE = {"model.architecture": "roberta", "model.num_hidden_layers": None, "model.intermediate_size": None}
BOUND_S = 8 * 60  # the whole command, data preparation included


def run_ours(spec: dict) -> dict:
    from mlm_tasks.paths import RunContext, RunPaths
    from mlm_tasks.steps.train import train
    from mlm_tasks.training.progress import read_history

    cfg, data, _, manifest = bench_train._setup(
        spec["preset"],
        "on",
        spec["steps"],
        log_every=spec["per_call"],
        precision=spec["precision"],
        device=spec["device"],
        batch=spec["batch"],
        extra={
            "train.steps_per_call": spec["per_call"],
            "train.eval_every": None,  # no validation in the timing
            **SHAPE,
            **({"model.architecture": "modernbert"} if spec["impl"] == "modernbert" else {}),
        },
    )
    run_id = f"bench-gpu-{spec['impl']}-{spec['preset']}-{os.getpid()}-{int(time.time())}"
    summary = train(cfg, RunContext.of(cfg, run_id, data["fingerprint"]))
    # One history entry per call (log_every = steps_per_call), stamped when the call's results are back.
    elapsed = {h["step"]: h["elapsed_s"] for h in read_history(RunPaths(cfg.output_root, run_id))}
    seconds = elapsed[spec["steps"]] - elapsed[spec["warmup"]]
    tokens = (spec["steps"] - spec["warmup"]) * summary["global_batch"] * manifest.max_length
    return {
        "tokens_per_s": tokens / seconds,
        "flops_per_token": summary["flops_per_token"],
        "peak_flops": summary["peak_flops"],
        "steps_per_call": summary["steps_per_call"],
        "last_loss": summary["last_loss"],
        "parameters": summary["parameters"],
        "summary_tokens_per_s": summary["tokens_per_s"],
        "summary_mfu_of": summary["mfu_of"],
        "seq_len": manifest.max_length,
        "vocab_size": data["vocab_size"],
        **device_facts(spec["device"]),
    }


def run_reference(spec: dict) -> dict:
    from mlm_tasks.model.flops import flops_per_token

    cfg, data, paths, manifest = bench_train._setup(
        spec["preset"],
        "on",
        spec["steps"],
        precision=spec["precision"],
        device=spec["device"],
        batch=spec["batch"],
        extra=SHAPE,
    )
    result, model = bench_train.fit_reference(cfg, data, paths, manifest, spec["precision"], spec["warmup"])
    return {
        **result,
        "flops_per_token": flops_per_token(model.config, manifest.max_length),  # head everywhere
        "steps_per_call": 1,  # compile() without steps_per_execution: one host dispatch per step
        **device_facts(spec["device"]),
    }


def device_facts(device: str) -> dict:
    """The GPU's name and what TensorFlow was built against; its allocator's peak since the process began."""
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    facts = {"tensorflow": tf.__version__, "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version")}
    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        facts.update(
            gpu=details.get("device_name"),
            compute_capability=details.get("compute_capability"),
            gpus=len(gpus),
            device_peak_mb=tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20,
        )
    return facts


def nvidia_smi() -> str:
    """Name, driver and memory of each GPU, as nvidia-smi reports them ('' without it)."""
    if not shutil.which("nvidia-smi"):
        return ""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    if out.returncode:  # installed, but no driver or no GPU answers
        return ""
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip())


def plan(args) -> dict:
    """What both loops run: the device, steps per call, batch and warm-up, checked against each other."""
    from mlm_tasks.training.device import select_device
    from mlm_tasks.training.plan import steps_per_call

    device = select_device(args.device)
    if args.device != "cpu":  # (the CPU check skips TensorFlow's import here)
        import tensorflow as tf

        seen = tf.config.list_physical_devices("GPU")
        if (device == "gpu" and not seen) or (device == "cpu" and nvidia_smi()):
            raise SystemExit(
                f"nvidia-smi sees {nvidia_smi() or 'no GPU'}, TensorFlow sees {len(seen)} GPU(s): install "
                'its CUDA libraries (uv pip install "tensorflow[and-cuda]==<the locked version>", '
                "bench/README.md), or run the CPU check with --device cpu."
            )
        if device == "gpu":  # this process only plans: it never takes GPU memory the workers need
            tf.config.set_visible_devices([], "GPU")
    per_call = steps_per_call(args.steps_per_call, device)
    warmup = args.warmup if args.warmup is not None else 2 * per_call
    if warmup % per_call or args.steps % per_call or args.steps <= warmup:
        raise SystemExit(
            f"--steps {args.steps} and --warmup {warmup} must be multiples of steps per call ({per_call}"
            f" on {device}) with steps > warmup: e.g. --steps {per_call * 20} --warmup {2 * per_call}."
        )
    return {
        "preset": args.preset,
        "device": device,
        "precision": args.precision,
        "steps": args.steps,
        "warmup": warmup,
        "per_call": per_call,
        "batch": args.batch or (GPU_BATCH if device == "gpu" else 32),
    }


def report(spec: dict, results: dict, walls: dict) -> None:
    ours, ref = results["ours"], results["reference"]
    peak = ours["peak_flops"]  # the same device and precision for both loops: the training summary's peak
    gpu = ours.get("gpu")
    print(f"\n{common.machine()}")
    print(
        f"GPU: {gpu} (compute capability {ours.get('compute_capability')}, {ours.get('gpus')} visible; "
        f"nvidia-smi: {nvidia_smi() or 'absent'})"
        if gpu
        else f"device: {spec['device']} (no GPU)"
    )
    print(f"TensorFlow {ours['tensorflow']} built for CUDA {ours['cuda']}, cuDNN {ours['cudnn']}")
    print(
        f"model.preset {spec['preset']} ({ours['parameters'] / 1e6:.1f} M parameters, vocab {ours['vocab_size']}), "
        f"sequence length {ours['seq_len']}, global batch {spec['batch']}, {spec['precision']}, XLA on; "
        f"{spec['steps']} steps each, the first {spec['warmup']} not timed"
    )
    print(
        f"peak: {peak / 1e12:.4g} TFLOP/s {spec['precision']}, ours' training summary's (flops.py: a GPU's dense "
        "datasheet figure by its name; on CPU the host's peak: mlm_tasks/model/cpu_peak.py)"
        if peak
        else "peak: unknown (not in flops.py's PEAKS: add the GPU there): no MFU"
    )
    bound = "met" if walls["total"] <= BOUND_S else "NOT met"
    print(
        f"whole command {walls['total']:.0f} s (data {walls['data']:.0f} s, "
        + ", ".join(f"{name} {walls[name]:.0f} s" for name in LOOPS)
        + f"); bound {BOUND_S} s: {bound}\n"
    )
    memory = "peak GPU:0 MiB" if gpu else "peak RSS MiB"
    rows = []
    for name in LOOPS:
        r = results[name]
        utilisation = f"{100 * r['tokens_per_s'] * r['flops_per_token'] / peak:.1f}%" if peak else "unknown"
        rows.append(
            [
                name,
                r["tokens_per_s"],
                utilisation,
                r["flops_per_token"] / 1e6,
                r.get("device_peak_mb", r["peak_rss_mb"]),
                r["steps_per_call"],
                r["last_loss"],
            ]
        )
    print(common.table(["loop", "tokens/s", "MFU", "MFLOP/token", memory, "steps/call", "last loss"], rows))
    print(
        f"\nours / reference tokens/s: **{ours['tokens_per_s'] / ref['tokens_per_s']:.2f}×**; ours' training summary "
        f"(after its first call): {ours['summary_tokens_per_s'] or 0:,.0f} tokens/s, {ours['summary_mfu_of']}"
    )
    print(
        f"modernbert: ours on ModernBERT's shape of preset {spec['preset']} "
        f"({results['modernbert']['parameters'] / 1e6:.1f} M parameters; MFU by flops.py's ModernBERT count, a "
        "local layer's attention at its window)"
    )
    print("target: ours >= 40% MFU on an H200, the reference beside it")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="base", help="model.preset (tiny for a CPU check)")
    p.add_argument("--steps", type=int, default=320, help="optimizer steps of each loop")
    p.add_argument("--warmup", type=int, help="steps not timed (default: 2 calls of ours' loop)")
    p.add_argument("--batch", type=int, help=f"global batch (default {GPU_BATCH} on a GPU, 32 on CPU)")
    p.add_argument("--precision", default="bf16", choices=["bf16", "off"])
    p.add_argument("--steps-per-call", default="auto", help="ours' train.steps_per_call (auto: 16 on GPU, 1 on CPU)")
    p.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    p.add_argument("--config", help="the data's config (default $MLM_BENCH_CONFIG or configs/default.yaml)")
    p.add_argument("--worker")
    args = p.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        return common.emit((run_reference if spec["impl"] == "reference" else run_ours)(spec))
    began = time.time()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # one GPU for both loops (ours would mirror over all)
    if args.config:  # for this process and, through the environment, the workers
        common.BENCH_CONFIG = os.environ["MLM_BENCH_CONFIG"] = os.path.abspath(args.config)
    spec = plan(args)
    common.prepared()
    walls = {"data": time.time() - began}
    results = {}
    for impl in LOOPS:
        t0 = time.time()
        results[impl] = common.run_worker(__file__, json.dumps({**spec, "impl": impl}))
        walls[impl] = time.time() - t0
        print(f"{impl}: {results[impl]['tokens_per_s']:,.0f} tokens/s in {walls[impl]:.0f} s", file=sys.stderr)
    walls["total"] = time.time() - began
    report(spec, results, walls)


if __name__ == "__main__":
    main()
