"""MFU and cost (mlm_tasks/model/flops.py, mlm_tasks/tpu/prices.py): the FLOPs count against a hand count,
the peak a run is measured against, the plan before spending, and MFU in a real run's lines and summary.

    TF_USE_LEGACY_KERAS=1 .venv/bin/python -m pytest tests/mlm_tasks/model/test_flops.py -q
"""

import logging

import pytest

from mlm_tasks.config import build_config
from mlm_tasks.model import cpu_peak
from mlm_tasks.model.flops import Peak, device_peak, flops_per_token, mfu
from mlm_tasks.paths import RunContext
from mlm_tasks.tpu import prices
from mlm_tasks.training.plan import plan_lines

ROBERTA_BASE = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "vocab_size": 50265}


def test_flops_per_token_of_roberta_base_by_hand():
    # 12 layers x (4 x 768^2 + 2 x 768 x 3072) = 84.9 M matrix parameters; the head 768^2 + 768 x 50265.
    encoder, head = 12 * (4 * 768**2 + 2 * 768 * 3072), 768**2 + 768 * 50265
    attention = 12 * 12 * 768 * 128
    assert flops_per_token(ROBERTA_BASE, 128) == 6 * (encoder + head) + attention
    # The head runs at 20 of 128 positions: its share of the count shrinks by as much, the rest stays.
    assert flops_per_token(ROBERTA_BASE, 128, 20) == pytest.approx(6 * (encoder + head * 20 / 128) + attention)
    assert 0.7e9 < flops_per_token(ROBERTA_BASE, 128) < 0.9e9  # ~6 x 125 M parameters: the usual figure


def test_tpu_peak_and_the_mfu_line():
    peak = device_peak("tpu", "bf16", replicas=4, accelerator_type="v4-8")
    assert (peak.total, peak.devices) == (4 * 275e12, 4)
    utilisation = mfu(tokens_per_s=500_000, per_token=0.7e9, peak=peak)
    assert utilisation == pytest.approx(500_000 * 0.7e9 / 1.1e15)
    assert peak.describe(utilisation) == "MFU 31.8% of 4 × 275 TFLOP/s bf16 (TPU v4)"
    unknown = device_peak("tpu", "bf16", replicas=8, accelerator_type="v3-8")  # not in the table
    assert unknown.total is None and mfu(1000.0, 1e9, unknown) is None
    assert "not in mlm_tasks/model/flops.py's PEAKS" in unknown.describe()


def test_a_cpus_peak_from_its_isa_is_cores_times_flops_per_cycle_times_frequency():
    # Hand-computed: 2 cores × 3.0 GHz × 64 fp32 FLOPs a cycle (AVX-512: 2 FMA pipes × 16 lanes × 2).
    avx512 = cpu_peak.isa_peak({"avx2", "avx512f", "fma"}, cores=2, hz=3.0e9)
    assert (avx512.flops, avx512.precision) == (384e9, "fp32") and "2 cores × 3.00 GHz × 64" in avx512.source
    assert cpu_peak.isa_peak({"avx2"}, cores=4, hz=2.5e9).flops == 4 * 2.5e9 * 32
    amx = cpu_peak.isa_peak({"avx512f", "avx512_bf16", "amx_bf16"}, cores=8, hz=2.0e9)  # the widest unit counts
    assert (amx.flops, amx.precision) == (8 * 2.0e9 * 2048, "bf16")
    assert cpu_peak.isa_peak({"sse2"}, cores=2, hz=3.0e9) is None
    assert cpu_peak.max_frequency_hz("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz") in (2.7e9, pytest.approx(2.7e9))
    info = cpu_peak.cpu_info("model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n")
    assert info["model"] == "AMD EPYC" and {"avx2", "fma"} <= info["flags"] and info["cores"] >= 1


def test_a_measured_cpu_peak_is_the_best_precision_and_measured_once_on_a_quiet_machine(tmp_path, monkeypatch):
    """Where the frequency is hidden: the best GEMM rate of fp32 and bf16, cached for the machine kind. A
    bf16 run on a CPU whose bf16 matmuls are slow then reads a low MFU, not 99.8%."""
    monkeypatch.setenv("MLM_CPU_PEAK_CACHE", str(tmp_path / "peak.json"))
    rates = {"fp32": 120e9, "bf16": 60e9}  # TensorFlow's bf16 at half the fp32 rate, as on one Intel kind
    monkeypatch.setattr(cpu_peak, "gemm_rate", lambda precision: rates[precision])
    info = {"model": "Test CPU", "flags": set(), "cores": 2}
    monkeypatch.setattr(cpu_peak, "busy_load", lambda: 3.5)  # beside another job: used, never cached
    busy = cpu_peak.measured_peak(info)
    assert busy.flops == 120e9 and "not cached: the machine was busy, load 3.5" in busy.source
    assert not (tmp_path / "peak.json").exists()
    monkeypatch.setattr(cpu_peak, "busy_load", lambda: None)  # a quiet machine
    first = cpu_peak.measured_peak(info)
    assert (first.flops, first.precision) == (120e9, "fp32") and "measured peak: fp32 GEMM 2048³" in first.source
    monkeypatch.setattr(cpu_peak, "gemm_rate", lambda precision: pytest.fail("measured twice"))
    assert cpu_peak.measured_peak(info) == first  # from the cache
    # Another kind under the same model name (an AVX2-only "AMD EPYC" beside an AVX-512-BF16 one) is measured anew.
    other = {**info, "flags": {"avx2"}}
    assert cpu_peak.machine_kind(other) == "Test CPU (AVX2) × 2 cores" != cpu_peak.machine_kind(info)
    monkeypatch.setattr(cpu_peak, "gemm_rate", lambda precision: {"fp32": 50e9, "bf16": 10e9}[precision])
    assert cpu_peak.measured_peak(other).flops == 50e9
    peak = Peak(first.flops, 1, first.precision, first.source)
    assert mfu(1000.0, 60e6, peak) == pytest.approx(0.5)  # a bf16 run at its kernels' full rate: 50%


def test_this_cpus_peak_is_real():
    peak = device_peak("cpu", "bf16", replicas=1)
    assert isinstance(peak, Peak) and peak.precision in ("fp32", "bf16") and 1e9 < peak.total < 1e14
    assert "peak" in peak.describe() and "matmul probe" not in peak.describe()


def test_the_plan_prices_a_tpu_run_on_demand_and_spot_before_it_starts():
    cfg = build_config(
        {
            "output_root": "gs://bkt/p",
            "compute": "tpu_vm",
            "shards": {"max_length": 128},
            "train": {"batch_size": 32, "max_predictions_per_seq": 20},
            "model": {"preset": "base"},
            "tpu": {"project": "p", "accelerator_type": "v4-8"},
        }
    )
    lines = plan_lines(cfg, 10_000, 50265)
    assert lines[0].startswith("Plan: 10,000 steps × global batch 128 × 128 tokens = 163,840,000 tokens")
    per_token = flops_per_token({**cfg.model.shape().model_dump(), "vocab_size": 50265}, 128, 20)
    hours = 163_840_000 * per_token / (4 * 275e12 * prices.ASSUMED_MFU) / 3600
    assert f"at 30% MFU: {hours:.2f} h of training" in lines[1]
    assert f"on-demand ${4 * 3.22 * hours:,.2f} ($12.88/h)" in lines[1] and "Spot $" in lines[1]
    assert "list price 2025-11" in lines[1]
    own = cfg.model_copy(update={"tpu": cfg.tpu.model_copy(update={"price_per_chip_hour": 2.0})})
    priced = plan_lines(own, 10_000, 50265)[1]
    assert "($8.00/h)" in priced and "tpu.price_per_chip_hour $2" in priced
    assert prices.cost(own.tpu, 3600) == pytest.approx(8.0)  # 4 chips x $2 for an hour


@pytest.mark.slow  # trains a model: ~20 s: in make test, not in make test-fast
def test_a_cpu_run_reports_its_mfu_in_the_lines_and_the_summary(tiny_prepared, caplog):
    from mlm_tasks.steps.train import train
    from peers.tiny_data import tiny_config

    cfg, data = tiny_prepared
    cfg = tiny_config(cfg.output_root, **{"train.steps": 6, "train.log_every": 2})
    caplog.set_level(logging.INFO, logger="mlm_tasks")
    summary = train(cfg, RunContext.of(cfg, "mfu-run", data["fingerprint"]))
    assert 0 < summary["mfu"] < 1 and summary["mfu_of"].startswith(f"MFU {100 * summary['mfu']:.1f}% of 1 × ")
    assert summary["flops_per_token"] > 0 and summary["cost_usd"] is None  # no TPU, no TPU bill
    assert any("tokens/s MFU " in r.getMessage() for r in caplog.records if "step 4/6" in r.getMessage())
