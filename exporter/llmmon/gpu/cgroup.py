"""Kubernetes pod UID and container ID of a process, from /proc/<pid>/cgroup.

This replaces kubelet's pod-resources gRPC (which dcgm-exporter dials on every scrape) with a
file read: the kubelet puts every container in a cgroup whose path names the pod UID and the
container ID.  The shapes differ by cgroup version and cgroup driver:

- v1, cgroupfs driver: `4:memory:/kubepods/burstable/pod<uid>/<container-id>`
- v1, systemd driver:  `4:memory:/kubepods.slice/kubepods-burstable.slice/`
  `kubepods-burstable-pod<uid with _>.slice/docker-<container-id>.scope`
- v2, systemd driver:  `0::/kubepods.slice/kubepods-pod<uid with _>.slice/`
  `cri-containerd-<container-id>.scope`
- v2, cgroupfs driver: `0::/kubepods/besteffort/pod<uid>/<container-id>`

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


def pod_of(procfs: RootedFS, pid: int) -> PodRef:
    """The process's pod, or an empty PodRef (not in Kubernetes, or already exited)."""
    try:
        return parse_cgroup(procfs.read_text(str(pid), "cgroup"))
    except SourceError:
        return PodRef()
