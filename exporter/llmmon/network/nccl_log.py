"""What one rank's NCCL log says about the transport it chose (placeholder: the dataclass only;
the parser lands from its own branch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NcclLog:
    version: str              # "2.21.5" ('' unknown), from "NCCL version 2.21.5+cuda12.4"
    net: str                  # "IB", "Socket", or a plugin's name as NCCL prints it; '' unseen
    net_devices: tuple[str, ...]   # as NCCL lists them after "Using": ("mlx5_0:1/RoCE", ...)
    gdr: bool | None          # GPUDirect RDMA used: True, False, or None if unknown
    paths: frozenset[str]     # transports of the channel lines: "P2P/IPC", "NET/IB", ...
    lines: int                # NCCL lines read
