"""A rank's NCCL log read through /proc/<pid>/root: the job names the path, so the daemon
walks it without following any link and without `..`, reads only a regular file its user
owns, never blocks on a FIFO, and reads at most what it was asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmmon.collectors.nccl import rank_ranges
from llmmon.network.nccl_reads import expand_debug_file, host_name
from llmmon.sources import procroot
from llmmon.sources.fs import RootedFS, SourceError

PID = 4242


@pytest.fixture
def proc(tmp_path: Path) -> RootedFS:
    (tmp_path / "proc" / str(PID) / "root" / "logs").mkdir(parents=True)
    (tmp_path / "proc" / str(PID) / "status").write_text("Name:\tpython\nNSpid:\t4242\t17\n")
    return RootedFS(str(tmp_path / "proc"))


def test_the_pid_is_the_one_inside_the_rank_s_namespace(proc: RootedFS) -> None:
    assert procroot.ns_pid(proc, PID) == 17
    assert procroot.ns_pid(proc, 999) == 999  # gone, or a kernel without NSpid


@pytest.mark.parametrize("template, host, expected", [
    ("/logs/nccl.%h.%p.log", "*", "/logs/nccl.*.17.log"),
    ("/logs/nccl.%h.%p.log", "pod-a", "/logs/nccl.pod-a.17.log"),
    ("/logs/nccl.log", "*", "/logs/nccl.log"),
    ("/logs/100%%.%q.%", "*", "/logs/100%.%q.%"),
])
def test_nccl_debug_file_is_expanded_as_nccl_does(template: str, host: str,
                                                  expected: str) -> None:
    assert expand_debug_file(template, 17, host) == expected


def test_the_host_name_is_nccl_s_own_up_to_its_first_dot() -> None:
    assert host_name({"HOSTNAME": "worker-3.cluster.local"}) == "worker-3"
    assert host_name({"NCCL_HOSTNAME": "n7", "HOSTNAME": "worker-3"}) == "n7"
    assert host_name({}) == host_name({"HOSTNAME": "../etc"}) == "*"


def test_the_newest_matching_regular_file_is_the_rank_s(proc: RootedFS) -> None:
    base = procroot.root(proc, PID)
    for age, name in enumerate(("nccl.pod-a.17.log", "nccl.pod-b.17.log", "other.log")):
        path = Path(base, "logs", name)
        path.write_text("x" * (age + 1))
        os.utime(path, ns=(10**18 + age, 10**18 + age * (1 if name != "other.log" else -5)))
    Path(base, "logs", "nccl.dir.17.log").mkdir()
    found = procroot.newest(base, "/logs", "nccl.*.17.log")
    assert found is not None and found.name == "nccl.pod-b.17.log" and found.size == 2
    assert procroot.newest(base, "/logs", "nccl.pod-a.17.log").name == "nccl.pod-a.17.log"
    assert procroot.newest(base, "/logs", "none.*.log") is None
    with pytest.raises(procroot.Missing):
        procroot.newest(base, "/missing", "nccl.*.log")


def test_no_link_and_no_dot_dot_lead_out_of_the_job_s_files(proc: RootedFS,
                                                             tmp_path: Path) -> None:
    """A link the job planted anywhere on the path, or `..`, is refused: the daemon never
    reads a host file through it (the kernel resolves an absolute link against the daemon's
    root, not the container's)."""
    base = procroot.root(proc, PID)
    secret = tmp_path / "host" / "etc"
    secret.mkdir(parents=True)
    (secret / "nccl.log").write_text("host secret")
    Path(base, "escape").symlink_to(secret)  # a directory link in the middle
    Path(base, "logs", "link.log").symlink_to(secret / "nccl.log")  # a link as the file
    with pytest.raises(SourceError, match="symbolic links|Not a directory"):
        procroot.newest(base, "/escape", "nccl.log")
    assert procroot.newest(base, "/logs", "link.log") is None  # not a regular file
    with pytest.raises(SourceError, match="'..'"):
        procroot.newest(base, "/logs/../../../host/etc", "nccl.log")


def test_only_a_regular_file_of_the_rank_s_own_user_is_read(proc: RootedFS) -> None:
    base = procroot.root(proc, PID)
    Path(base, "logs", "nccl.log").write_text("NCCL INFO " * 1000)
    me = os.getuid()
    found = procroot.newest(base, "/logs", "nccl.log")
    assert found is not None and found.size == 10_000
    assert procroot.read_owned(base, found, me, 50) == "NCCL INFO " * 5
    with pytest.raises(SourceError, match="owned by uid"):
        procroot.read_owned(base, found, me + 1, 50)
    os.mkfifo(Path(base, "logs", "fifo.log"))
    fifo = procroot.Found("/logs", "fifo.log", 0, 0)  # a file swapped for a FIFO after its stat
    with pytest.raises(SourceError, match="not a regular file"):
        procroot.read_owned(base, fifo, me, 50)


def test_ranks_are_named_as_ranges() -> None:
    assert rank_ranges([6, 0, 1, 2, 3]) == "0-3,6"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([1, 3, 4, 4]) == "1,3-4"
