"""A rank's NCCL log read through /proc/<pid>/root: the job names the path, so the daemon
reads only a regular file its user owns, never follows a final link, never blocks on a FIFO,
and reads at most what it was asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmmon.collectors.nccl import expand_debug_file, rank_ranges
from llmmon.sources import procroot
from llmmon.sources.fs import RootedFS, SourceError

PID = 4242


@pytest.fixture
def proc(tmp_path: Path) -> RootedFS:
    (tmp_path / str(PID) / "root" / "logs").mkdir(parents=True)
    (tmp_path / str(PID) / "status").write_text("Name:\tpython\nNSpid:\t4242\t17\n")
    return RootedFS(str(tmp_path))


def test_the_pid_is_the_one_inside_the_rank_s_namespace(proc: RootedFS) -> None:
    assert procroot.ns_pid(proc, PID) == 17
    assert procroot.ns_pid(proc, 999) == 999  # gone, or a kernel without NSpid


@pytest.mark.parametrize("template, expected", [
    ("/logs/nccl.%h.%p.log", "/logs/nccl.*.17.log"),
    ("/logs/nccl.log", "/logs/nccl.log"),
    ("/logs/100%%.%q.%", "/logs/100%.%q.%"),
])
def test_nccl_debug_file_is_expanded_as_nccl_does(template: str, expected: str) -> None:
    assert expand_debug_file(template, 17) == expected


def test_a_host_name_wildcard_finds_the_rank_s_file_only_in_its_own_directory(
        proc: RootedFS) -> None:
    base = procroot.root(proc, PID)
    for name in ("nccl.pod-a.17.log", "nccl.pod-a.18.log", "other.log"):
        Path(base, "logs", name).write_text("x")
    assert procroot.find(base, "/logs/nccl.*.17.log") == ["/logs/nccl.pod-a.17.log"]
    assert procroot.find(base, "/lo*/nccl.*.17.log") == []  # a wildcard only in the name
    assert procroot.find(base, "relative/nccl.log") == []
    assert procroot.find(base, "/missing/nccl.*.log") == []


def test_only_a_regular_file_of_the_rank_s_own_user_is_read(proc: RootedFS,
                                                              tmp_path: Path) -> None:
    base = procroot.root(proc, PID)
    log = Path(base, "logs", "nccl.log")
    log.write_text("NCCL INFO " * 1000)
    me = os.getuid()
    assert procroot.read_owned(base, "/logs/nccl.log", me, 50) == ("NCCL INFO " * 5)
    with pytest.raises(SourceError, match="owned by uid"):
        procroot.read_owned(base, "/logs/nccl.log", me + 1, 50)
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    Path(base, "logs", "link.log").symlink_to(secret)
    with pytest.raises(SourceError, match="symbolic links"):
        procroot.read_owned(base, "/logs/link.log", me, 50)
    os.mkfifo(Path(base, "logs", "fifo.log"))
    with pytest.raises(SourceError, match="not a regular file"):
        procroot.read_owned(base, "/logs/fifo.log", me, 50)
    with pytest.raises(SourceError):
        procroot.signature(base, "/logs/missing.log")
    assert procroot.signature(base, "/logs/nccl.log")[0] == 10_000


def test_ranks_are_named_as_ranges() -> None:
    assert rank_ranges([6, 0, 1, 2, 3]) == "0-3,6"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([1, 3, 4, 4]) == "1,3-4"
