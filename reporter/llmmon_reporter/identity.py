"""Who this training process is: job, rank, node, GPU and allocator settings.

Everything here is read from the environment or from torch state that is already there; no
call initialises CUDA or talks to other ranks.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any, Mapping

_NO_RUN_ID = ("", "none")


def job_from_env(env: Mapping[str, str]) -> str | None:
    """LLMMON_JOB, else the torchelastic run id ("none" unless set), else the Slurm job."""
    for key in ("LLMMON_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = env.get(key, "").strip()
        if value.lower() not in _NO_RUN_ID:
            return value
    return None


def rendezvous_job(endpoint: str) -> str:
    """A job id every rank (and every node's launcher) derives alike from the rendezvous."""
    return f"rdzv-{hashlib.sha1(endpoint.encode()).hexdigest()[:12]}"


def job_id(env: Mapping[str, str]) -> str:
    found = job_from_env(env)
    if found:
        return found
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if addr and port:
        return rendezvous_job(f"{addr}:{port}")
    # No rendezvous in the environment (init_method in code): ranks under one launcher share it.
    return f"{socket.gethostname()}-{os.getppid()}"


def local_rank(env: Mapping[str, str], rank: int) -> int:
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return rank


def cuda_device(torch: Any, env: Mapping[str, str], local: int) -> int:
    """The GPU this rank trains on, without asking CUDA for the (per-thread) current device.

    torchrun jobs call `torch.cuda.set_device(LOCAL_RANK)`; LLMMON_CUDA_DEVICE overrides.
    """
    if env.get("LLMMON_CUDA_DEVICE", "").isdigit():
        return int(env["LLMMON_CUDA_DEVICE"])
    count = torch.cuda.device_count()
    return local % count if count > 1 else 0


def gpu(torch: Any, device: int) -> dict[str, str]:
    """UUID (NVML's GPU-... form, to join with the GPU metrics) and model of the rank's GPU."""
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", ""))
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"
    return {"uuid": uuid, "gpu_name": str(props.name)}


def pod(env: Mapping[str, str]) -> str:
    """POD_NAME (the downward API's metadata.name), else the host name: a hostNetwork pod, as
    RDMA training pods usually are, has the node's host name, not its own."""
    return env.get("POD_NAME", "").strip() or socket.gethostname()


def identity(env: Mapping[str, str], rank: int, world_size: int) -> dict[str, Any]:
    return {
        "job_id": job_id(env),
        "rank": rank,
        "local_rank": local_rank(env, rank),
        "world_size": world_size,
        "pod": pod(env),
        "namespace": env.get("POD_NAMESPACE", ""),
        "pid": os.getpid(),
        "uuid": "",
        "gpu_name": "",
        "allocator_config": env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF", ""),
        "nccl_env": nccl_env(env),
    }


MAX_NCCL_VARIABLES = 64
MAX_NCCL_VALUE = 512


def nccl_env(env: Mapping[str, str]) -> dict[str, str]:
    """The rank's NCCL_* variables, for the daemon's NCCL checks where it cannot read
    /proc/<pid>/environ (no CAP_SYS_PTRACE); bounded."""
    names = sorted(k for k in env if k.startswith("NCCL_"))[:MAX_NCCL_VARIABLES]
    return {k: env[k][:MAX_NCCL_VALUE] for k in names}
