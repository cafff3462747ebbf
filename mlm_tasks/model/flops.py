"""Model FLOPs utilisation (MFU): the model's training FLOPs per token (PaLM's count, the LM head only where
it runs) over the device's dense peak. docs/google-cloud.md

    fpt = flops_per_token(model_config, seq_len=128, max_predictions=32)
    peak = device_peak("tpu", "bf16", replicas=4, accelerator_type="v4-8")
    mfu(tokens_per_s, fpt, peak); peak.describe(utilisation)   # "MFU 31.0% of 4 × 275 TFLOP/s bf16 (TPU v4)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlm_tasks.model.cpu_peak import cpu_peak

# (name, dense peak FLOP/s per chip or GPU), checked 2026-12: https://cloud.google.com/tpu/docs/{v4,v5e,v5p}, NVIDIA's
# A100/H100/H200 SXM datasheets. A TPU's fp32 (bf16 passes, about a third) is not listed: the run says "unknown".
PEAKS: dict[str, tuple[str, dict[str, float]]] = {
    "tpu-v4": ("TPU v4", {"bf16": 275e12}),
    "tpu-v5litepod": ("TPU v5e", {"bf16": 197e12}),
    "tpu-v5p": ("TPU v5p", {"bf16": 459e12}),
    "gpu-a100": ("A100", {"bf16": 312e12, "fp32": 19.5e12}),
    "gpu-h100": ("H100", {"bf16": 989e12, "fp32": 67e12}),
    "gpu-h200": ("H200", {"bf16": 989e12, "fp32": 67e12}),
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
        """The MFU and the peak it is of (without a utilisation: the peak)."""
        if not self.per_device:
            return f"MFU unknown ({self.source}: no peak for {self.precision})"
        peak = f"{self.devices} × {self.per_device / 1e12:.3g} TFLOP/s {self.precision} ({self.source})"
        return f"MFU {100 * utilisation:.1f}% of {peak}" if utilisation is not None else peak


def flops_per_token(config: Any, seq_len: int, max_predictions: int = 0) -> float:
    """Training FLOPs per token of a RoBERTa or ModernBERT masked LM (`config`: its config, or a dict). A
    ModernBERT local layer's attention counts its window only (local_attention + 1 keys), as it needs."""
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
    """The peak of `replicas` TPU chips of `accelerator_type`, of GPUs by their name, or of this CPU (the host)."""
    precision = "bf16" if precision == "bf16" else "fp32"
    if device == "cpu":  # the host's peak in any precision: a slow precision then reads a low MFU
        host = cpu_peak()
        return Peak(host.flops, 1, host.precision, host.source)
    key = f"tpu-{accelerator_type.split('-', 1)[0]}" if device == "tpu" else _gpu_key()
    if key is None or key not in PEAKS:
        what = accelerator_type if device == "tpu" else "this GPU"
        return Peak(None, replicas, precision, f"{what} is not in mlm_tasks/model/flops.py's PEAKS")
    name, peaks = PEAKS[key]
    return Peak(peaks.get(precision), replicas, precision, name)


def mfu(tokens_per_s: float | None, per_token: float, peak: Peak) -> float | None:
    return tokens_per_s * per_token / peak.total if tokens_per_s and peak.total else None
