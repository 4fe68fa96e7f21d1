"""Dense peak tensor throughput per GPU model: the denominator of MFU.

Values are dense (no 2:4 sparsity) FLOP/s at boost clock, per GPU.  Datasheets print tensor
figures "with sparsity" (marked *); dense is half of those.  A model matched by none of the
patterns gets no `llmmon_gpu_peak_flops` series rather than a guess.
"""

from __future__ import annotations

import re

T = 1e12
P = 1e15

# (pattern on the NVML device name, {dtype: dense FLOP/s}); first match wins.
TABLE: tuple[tuple[re.Pattern[str], dict[str, float]], ...] = (
    # NVIDIA GB200 NVL72 datasheet, per rack with sparsity: FP8 720 PF, FP16/BF16 360 PF,
    # TF32 180 PF; divided by 72 GPUs and by 2 for dense.
    (re.compile(r"GB200"), {"bf16": 2.5 * P, "fp16": 2.5 * P, "fp8": 5 * P, "tf32": 1.25 * P}),
    # NVIDIA HGX B200 datasheet, per 8 GPUs with sparsity: FP8 72 PF, FP16/BF16 36 PF,
    # TF32 18 PF; divided by 8 and by 2.
    (re.compile(r"(?<!G)B200"),
     {"bf16": 2.25 * P, "fp16": 2.25 * P, "fp8": 4.5 * P, "tf32": 1.125 * P}),
    # NVIDIA H200 datasheet, H200 NVL column, with sparsity: FP8 3,341 TF, BF16/FP16 1,671 TF,
    # TF32 835 TF.
    (re.compile(r"H200\s*NVL"),
     {"bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1670.5 * T, "tf32": 417.5 * T}),
    # NVIDIA H200 datasheet, H200 SXM column, with sparsity: FP8 3,958 TF, BF16/FP16 1,979 TF,
    # TF32 989 TF (the same tensor cores and clocks as H100 SXM).
    (re.compile(r"(?<!G)H200"),
     {"bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T, "tf32": 494.5 * T}),
    # NVIDIA GH200 Grace Hopper Superchip datasheet, GPU with sparsity: FP8 3,958 TF,
    # BF16/FP16 1,979 TF, TF32 989 TF.
    (re.compile(r"GH200"),
     {"bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T, "tf32": 494.5 * T}),
    # NVIDIA H100 datasheet, H100 SXM column (NVML name "NVIDIA H100 80GB HBM3"), with
    # sparsity: FP8 3,958 TF, BF16/FP16 1,979 TF, TF32 989 TF.
    (re.compile(r"H100 80GB HBM3|H100 SXM"),
     {"bf16": 989.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T, "tf32": 494.5 * T}),
    # NVIDIA H100 datasheet, H100 PCIe column, with sparsity: FP8 3,026 TF,
    # BF16/FP16 1,513 TF, TF32 756 TF.
    (re.compile(r"H100 PCIe", re.IGNORECASE),
     {"bf16": 756.5 * T, "fp16": 756.5 * T, "fp8": 1513 * T, "tf32": 378 * T}),
    # NVIDIA A100 datasheet (SXM4 and PCIe, 40 and 80 GB alike), dense: BF16/FP16 312 TF,
    # TF32 156 TF.  Ampere has no FP8.
    (re.compile(r"A100"), {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T}),
    # NVIDIA L40S datasheet, dense: FP8 733 TF, BF16/FP16 362.05 TF, TF32 183 TF.
    (re.compile(r"L40S"), {"bf16": 362.05 * T, "fp16": 362.05 * T, "fp8": 733 * T,
                           "tf32": 183 * T}),
)


def peak_flops(model: str) -> dict[str, float]:
    """Dense FLOP/s by dtype (bf16, fp16, fp8, tf32) for an NVML device name; {} if unknown."""
    for pattern, values in TABLE:
        if pattern.search(model):
            return values
    return {}
