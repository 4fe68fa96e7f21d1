"""Whether GPUDirect RDMA can go through DMA-BUF instead of a peer-memory module.

NCCL registers GPU memory with the NIC through DMA-BUF (no nvidia_peermem) when the kernel has
it for RDMA (Linux 5.12 and newer) and CUDA exports GPU memory as DMA-BUF, which it does only
with NVIDIA's open GPU kernel module (`/proc/driver/nvidia/version` says "Open Kernel
Module").  Both are read from procfs: `sys/kernel/osrelease` and that version file.
"""

from __future__ import annotations

import re

from llmmon.sources.fs import RootedFS, SourceError

MINIMUM_KERNEL = (5, 12)
_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def kernel_has_rdma_dmabuf(release: str) -> bool:
    """`6.8.0-45-generic` -> True; an unparsable release -> False."""
    match = _RELEASE.match(release)
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= MINIMUM_KERNEL


def supported(procfs: RootedFS) -> bool:
    """True when both the kernel and the NVIDIA driver let NCCL use DMA-BUF."""
    try:
        release = procfs.read_value("sys", "kernel", "osrelease")
        driver = procfs.read_value("driver", "nvidia", "version")
    except SourceError:
        return False
    return kernel_has_rdma_dmabuf(release) and "Open Kernel Module" in driver
