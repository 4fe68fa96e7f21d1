"""Pod UID and container ID from /proc/<pid>/cgroup: cgroup v1 and v2, systemd and cgroupfs."""

from __future__ import annotations

import pytest

from llmmon.gpu.cgroup import PodRef, SlurmRef, owners_of, parse_cgroup, parse_slurm
from llmmon.sources.fs import RootedFS
from tests.gpu.conftest import PROC

CONTAINER = "038603692f9ae5f4e6164b7226b59f1f34b10458eaf20ece8f7ca768097e0883"


@pytest.mark.parametrize("pid, shape, pod_uid, container", [
    (41000, "v2 systemd containerd", "6f1c2a3b-4d5e-4f60-8a1b-2c3d4e5f6071", "038603692f9a"),
    (41001, "v2 systemd cri-o guaranteed", "0b9e8d7c-6a5b-4c3d-9e2f-1a0b9c8d7e6f",
     "454e61a0dab0"),
    (41002, "v1 systemd docker (hybrid)", "d2c1b0a9-8f7e-4d6c-b5a4-938271605f4e",
     "6b66866c3e47"),
    (41003, "v1 cgroupfs", "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d", "409e6ac6dca6"),
    (41004, "v2 cgroupfs", "9f8e7d6c-5b4a-4392-a1b0-c9d8e7f6a5b4", "d9bc69dd92e8"),
    (41005, "v2 systemd, nested cgroup", "1e2d3c4b-5a69-4788-96a5-b4c3d2e1f0a9",
     "73285fdbe67c"),
])
def test_fixture_shapes(pid: int, shape: str, pod_uid: str, container: str) -> None:
    ref, _ = owners_of(RootedFS(str(PROC)), pid)
    assert ref.pod_uid == pod_uid, shape
    assert ref.container_id[:12] == container and len(ref.container_id) == 64, shape


def test_processes_outside_kubernetes_or_gone() -> None:
    procfs = RootedFS(str(PROC))
    assert owners_of(procfs, 41008) == (PodRef(), SlurmRef())  # a login session
    assert owners_of(procfs, 41009) == (PodRef(), SlurmRef())  # exited: no /proc entry


def test_pod_without_a_container_cgroup_yet() -> None:
    text = "0::/kubepods.slice/kubepods-besteffort.slice/" \
           "kubepods-besteffort-pod6f1c2a3b_4d5e_4f60_8a1b_2c3d4e5f6071.slice\n"
    assert parse_cgroup(text) == PodRef("6f1c2a3b-4d5e-4f60-8a1b-2c3d4e5f6071", "")


def test_a_word_that_merely_contains_pod_is_not_a_pod() -> None:
    assert parse_cgroup("0::/system.slice/podman-3a1b.scope\n") == PodRef()
    assert parse_cgroup(f"0::/machine.slice/docker-{CONTAINER}.scope\n") == PodRef()


@pytest.mark.parametrize("pid, shape, job, step", [
    (41010, "v1, a numbered step's task", "4242", "0"),
    (41011, "v2, the batch step", "4243", "batch"),
    (41012, "v2, one of several slurmd on a host", "977", "3"),
])
def test_slurm_tasks(pid: int, shape: str, job: str, step: str) -> None:
    procfs = RootedFS(str(PROC))
    assert owners_of(procfs, pid) == (PodRef(), SlurmRef(job, step)), shape


@pytest.mark.parametrize("pid", [41000, 41008, 41009, 41013])
def test_not_a_slurm_task(pid: int) -> None:
    """A pod, a login session, a process gone, slurmstepd's own cgroup."""
    assert owners_of(RootedFS(str(PROC)), pid)[1] == SlurmRef()


@pytest.mark.parametrize("text", [
    "0::/slurm/uid_x/job_1/step_0/task_0\n",  # uid not a number
    "0::/system.slice/slurmstepd.scope/job_/step_0\n",
    "0::/system.slice/slurmstepd.scope/job_12/step_evil/user/task_0\n",
    "0::/home/job_12/step_0\n",  # a directory that only looks like it
])
def test_what_only_looks_like_a_slurm_cgroup(text: str) -> None:
    assert parse_slurm(text) == SlurmRef()
