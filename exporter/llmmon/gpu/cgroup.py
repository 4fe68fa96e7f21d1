"""Kubernetes pod UID and container ID, or Slurm job and step, of a process, from /proc/<pid>/cgroup.

This replaces kubelet's pod-resources gRPC (which dcgm-exporter dials on every scrape) with a
file read: the kubelet puts every container in a cgroup whose path names the pod UID and the
container ID.  The shapes differ by cgroup version and cgroup driver:

- v1, cgroupfs driver: `4:memory:/kubepods/burstable/pod<uid>/<container-id>`
- v1, systemd driver:  `4:memory:/kubepods.slice/kubepods-burstable.slice/`
  `kubepods-burstable-pod<uid with _>.slice/docker-<container-id>.scope`
- v2, systemd driver:  `0::/kubepods.slice/kubepods-pod<uid with _>.slice/`
  `cri-containerd-<container-id>.scope`
- v2, cgroupfs driver: `0::/kubepods/besteffort/pod<uid>/<container-id>`

Slurm's task/cgroup and proctrack/cgroup plugins put each task in a cgroup named for its job,
step and task (https://slurm.schedmd.com/cgroup_v2.html, https://slurm.schedmd.com/cgroups.html):

- v1: `4:memory:/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>` (the `slurm` directory is
  `slurm_<node>` where one host runs several slurmd)
- v2: `0::/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`
  (`<node>_slurmstepd.scope` likewise)

A step is a number, or `batch`, `extern` or `interactive`.

The daemon needs the host's PID namespace (hostPID) and /proc (--path.procfs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:(?:docker|crio|cri-containerd|containerd)-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


@dataclass(frozen=True)
class PodRef:
    pod_uid: str = ""
    container_id: str = ""


def parse_cgroup(text: str) -> PodRef:
    """The pod and container named by the first cgroup line that names a pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for index, part in enumerate(parts):
            pod = _POD.search(part)
            if pod is None:
                continue
            container = ""
            for later in parts[index + 1:]:
                match = _CONTAINER.match(later)
                if match:
                    container = match.group(1)
                    break
            return PodRef(pod.group(1).replace("_", "-"), container)
    return PodRef()


_SLURM = re.compile(r"/(?:slurm(?:_[^/]+)?/uid_\d+|[^/]*slurmstepd\.scope)/job_(\d+)"
                    r"/step_(\d+|batch|extern|interactive)(?:/|$)")


@dataclass(frozen=True)
class SlurmRef:
    job_id: str = ""
    step: str = ""


def parse_slurm(text: str) -> SlurmRef:
    """The Slurm job and step named by the first cgroup line that names one."""
    for line in text.splitlines():
        found = _SLURM.search(line.split(":", 2)[-1])
        if found:
            return SlurmRef(found.group(1), found.group(2))
    return SlurmRef()


def owners_of(procfs: RootedFS, pid: int) -> tuple[PodRef, SlurmRef]:
    """The process's pod and Slurm job, each empty when it has none (or has exited)."""
    try:
        text = procfs.read_text(str(pid), "cgroup")
    except SourceError:
        return PodRef(), SlurmRef()
    return parse_cgroup(text), parse_slurm(text)
