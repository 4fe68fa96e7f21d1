"""The MFU denominator: NVML device names to dense datasheet FLOP/s."""

from __future__ import annotations

import pytest

from llmmon.gpu.peak_flops import peak_flops


@pytest.mark.parametrize("model, bf16, fp8, tf32", [
    ("NVIDIA H200", 989.5e12, 1979e12, 494.5e12),
    ("NVIDIA H200 NVL", 835.5e12, 1670.5e12, 417.5e12),
    ("NVIDIA H100 80GB HBM3", 989.5e12, 1979e12, 494.5e12),
    ("NVIDIA H100 PCIe", 756.5e12, 1513e12, 378e12),
    ("NVIDIA GH200 480GB", 989.5e12, 1979e12, 494.5e12),
    ("NVIDIA B200", 2.25e15, 4.5e15, 1.125e15),
    ("NVIDIA GB200", 2.5e15, 5e15, 1.25e15),
    ("NVIDIA L40S", 362.05e12, 733e12, 183e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, None, 156e12),
    ("NVIDIA A100 80GB PCIe", 312e12, None, 156e12),
    ("NVIDIA A100-PCIE-40GB", 312e12, None, 156e12),
])
def test_known_models(model: str, bf16: float, fp8: float | None, tf32: float) -> None:
    values = peak_flops(model)
    assert values["bf16"] == values["fp16"] == bf16
    assert values.get("fp8") == fp8
    assert values["tf32"] == tf32


@pytest.mark.parametrize("model", ["NVIDIA H100 NVL", "Tesla V100-SXM2-32GB", "NVIDIA RTX A6000"])
def test_unknown_models_get_no_guess(model: str) -> None:
    assert peak_flops(model) == {}
