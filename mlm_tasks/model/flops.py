"""How well a run uses its hardware: the model's training FLOPs per token, the device's peak, and
their ratio, the model FLOPs utilisation (MFU).

    fpt = flops_per_token(model_config, seq_len=128, max_predictions=32)   # training FLOPs per token
    peak = device_peak("tpu", "bf16", replicas=4, accelerator_type="v4-8")  # Peak(4 x 275 TFLOP/s bf16, ...)
    mfu(tokens_per_s, fpt, peak)                                            # 0.31
    peak.describe(mfu)                                                      # "MFU 31% of 4 × 275 TFLOP/s bf16"

Why these counts: PaLM's FLOPs (appendix B), the LM head only where it runs; dense datasheet peaks
(PEAKS, with sources); on a CPU, its ISA's peak where the frequency is known, else the best GEMM rate
this machine kind reaches in any precision, measured once and cached (mlm_tasks/model/cpu_peak.py).
docs/google-cloud.md#what-a-run-costs-and-how-well-it-uses-the-hardware
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Dense peak FLOP/s per chip (TPU) or GPU, by precision. Checked 2026-12 against:
#   TPU v4   https://cloud.google.com/tpu/docs/v4       275 TFLOP/s bf16 per chip
#   TPU v5e  https://cloud.google.com/tpu/docs/v5e      197 TFLOP/s bf16 per chip
#   TPU v5p  https://cloud.google.com/tpu/docs/v5p      459 TFLOP/s bf16 per chip
#   A100     NVIDIA A100 datasheet (SXM)                312 bf16, 19.5 fp32 (156 tf32)
#   H100     NVIDIA H100 datasheet (SXM)                989 bf16 dense, 67 fp32
#   H200     NVIDIA H200 datasheet (SXM)                989 bf16 dense, 67 fp32
# fp32 on a TPU runs through bf16 passes (about a third of bf16): not listed, the run says "unknown".
PEAKS: dict[str, dict[str, float]] = {
    "tpu-v4": {"bf16": 275e12},
    "tpu-v5litepod": {"bf16": 197e12},
    "tpu-v5p": {"bf16": 459e12},
    "gpu-a100": {"bf16": 312e12, "fp32": 19.5e12},
    "gpu-h100": {"bf16": 989e12, "fp32": 67e12},
    "gpu-h200": {"bf16": 989e12, "fp32": 67e12},
}
NAMES = {
    "tpu-v4": "TPU v4",
    "tpu-v5litepod": "TPU v5e",
    "tpu-v5p": "TPU v5p",
    "gpu-a100": "A100",
    "gpu-h100": "H100",
    "gpu-h200": "H200",
}


@dataclass(frozen=True)
class Peak:
    per_device: float | None  # FLOP/s of one chip / GPU / this CPU; None: not known for this device
    devices: int
    precision: str  # bf16 or fp32
    source: str  # e.g. "TPU v4", "measured peak: fp32 GEMM 2048³, AMD EPYC × 2 cores, ..."

    @property
    def total(self) -> float | None:
        return self.per_device * self.devices if self.per_device else None

    def describe(self, utilisation: float | None = None) -> str:
        """ "MFU 31% of 4 × 275 TFLOP/s bf16 (TPU v4)" (or just the peak, without a utilisation)."""
        if not self.per_device:
            return f"MFU unknown ({self.source}: no peak for {self.precision})"
        peak = f"{self.devices} × {self.per_device / 1e12:.3g} TFLOP/s {self.precision} ({self.source})"
        return f"MFU {100 * utilisation:.1f}% of {peak}" if utilisation is not None else peak


def flops_per_token(config: Any, seq_len: int, max_predictions: int = 0) -> float:
    """Training FLOPs per token of a RoBERTa or ModernBERT masked LM (`config`: its config, or a dict;
    `model_type` modernbert: GeGLU's Wi is 2 x intermediate wide, and a local layer's attention needs only
    its window, local_attention + 1 keys, although it is computed densely here)."""
    values = config if isinstance(config, dict) else config.to_dict()
    d, ff, layers, vocab = (
        int(values[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )
    head_share = min(max_predictions, seq_len) / seq_len if max_predictions else 1.0
    head = (d * d + d * vocab) * head_share
    if values.get("model_type") != "modernbert":
        return 6 * (layers * (4 * d * d + 2 * d * ff) + head) + 12 * layers * d * seq_len
    every = int(values.get("global_attn_every_n_layers", 3))
    n_global = len(range(0, layers, every))
    context = n_global * seq_len + (layers - n_global) * min(seq_len, int(values.get("local_attention", 128)) + 1)
    return 6 * (layers * (4 * d * d + 3 * d * ff) + head) + 12 * d * context


def _gpu_key() -> str | None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "") if gpus else ""
    return next((key for key in PEAKS if key.startswith("gpu-") and key[4:] in name.lower()), None)


def device_peak(device: str, precision: str, replicas: int, accelerator_type: str = "") -> Peak:
    """The peak of what trains: `replicas` chips of `accelerator_type` on a TPU, GPUs by their name, or
    this CPU (one "device": the whole host; mlm_tasks/model/cpu_peak.py)."""
    precision = "bf16" if precision == "bf16" else "fp32"
    if device == "cpu":  # the host's peak in any precision: a slow precision then reads a low MFU
        from mlm_tasks.model.cpu_peak import cpu_peak

        host = cpu_peak()
        return Peak(host.flops, 1, host.precision, host.source)
    key = f"tpu-{accelerator_type.split('-', 1)[0]}" if device == "tpu" else _gpu_key()
    if key is None or key not in PEAKS:
        what = accelerator_type if device == "tpu" else "this GPU"
        return Peak(None, replicas, precision, f"{what} is not in mlm_tasks/model/flops.py's PEAKS")
    return Peak(PEAKS[key].get(precision), replicas, precision, NAMES[key])


def mfu(tokens_per_s: float | None, per_token: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation: the FLOP/s the model's math needs at this speed, over the peak."""
    if not tokens_per_s or not peak.total:
        return None
    return tokens_per_s * per_token / peak.total
