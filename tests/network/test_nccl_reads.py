"""Reading ranks' NCCL settings and logs from outside: the reporter's copy where procfs is
closed, what NCCL says it applied on top, and a log whose file system hangs blinding no other
rank."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from llmmon.network.nccl_reads import Process, RankReader
from llmmon.sources import procroot
from llmmon.sources.fs import RootedFS
from tests.conftest import FIXTURES

LOG = (FIXTURES / "nccl" / "logs" / "nccl-socket-loopback-gdr-disabled.log").read_bytes()


def rank(proc: Path, pid: int, env: dict[str, str] | None) -> Process:
    (proc / str(pid) / "root" / "logs").mkdir(parents=True)
    if env is not None:
        (proc / str(pid) / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (proc / str(pid) / "root" / "logs" / f"nccl.{pid}.log").write_bytes(LOG)
    return Process(pid, 1, None)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "proc").mkdir()
    return tmp_path / "proc"


def test_settings_are_the_environment_with_what_nccl_applied_on_top(proc: Path) -> None:
    """The log says NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME=lo were applied (from
    /etc/nccl.conf, say): they count although the environment does not hold them."""
    process = rank(proc, 11, {"NCCL_DEBUG_FILE": "/logs/nccl.%p.log", "NCCL_IB_HCA": "mlx5"})
    read = RankReader(RootedFS(str(proc)), "", 1 << 20).read(
        [process], time.time(), time.monotonic() + 5)[(11, 1)]
    assert read.error == "" and read.log is not None and read.log.net == "Socket"
    settings = read.settings
    assert settings is not None
    assert (settings.ib_hca, settings.ib_disable, settings.socket_ifname) == ("mlx5", "1", "lo")


def test_the_reporter_s_copy_serves_where_environ_cannot_be_read(proc: Path) -> None:
    process = rank(proc, 12, None)
    reported = Process(12, 1, {"NCCL_DEBUG_FILE": "/logs/nccl.%p.log", "NCCL_IB_HCA": "=m"})
    reader = RankReader(RootedFS(str(proc)), "", 1 << 20)
    read = reader.read([reported], time.time(), time.monotonic() + 5)[(12, 1)]
    assert read.environ is None and read.settings is not None
    assert read.settings.ib_hca == "=m" and read.log is not None
    bare = reader.read([process], time.time(), time.monotonic() + 5)[(12, 1)]
    assert bare.settings is None  # neither: unknown, and the collector says so


def test_a_hung_log_read_holds_up_no_other_rank(proc: Path, monkeypatch) -> None:
    """A rank's NCCL_DEBUG_FILE on a file system that hangs (an NFS server gone): its read is
    given up on at the deadline and keeps running in its thread; the other rank is read, and
    the hung rank is not read again until its read returns.  (The hang is injected into the
    directory lookup: no file system here can hang on demand.)"""
    env = {"NCCL_DEBUG_FILE": "/logs/nccl.%p.log"}
    hung, fine = rank(proc, 21, env), rank(proc, 22, env)
    release, calls = threading.Event(), []
    real = procroot.newest

    def newest(base: str, directory: str, pattern: str):
        calls.append(pattern)
        if pattern == "nccl.21.log":
            release.wait(30)
        return real(base, directory, pattern)

    monkeypatch.setattr(procroot, "newest", newest)
    reader = RankReader(RootedFS(str(proc)), "", 1 << 20)
    reads = reader.read([hung, fine], time.time(), time.monotonic() + 0.5)
    assert reads[(21, 1)].reading.is_alive()  # returned while that read still hangs
    assert reads[(22, 1)].log is not None and reads[(21, 1)].log is None
    assert reads[(21, 1)].stuck_for(time.monotonic()) > 0
    again = reader.read([hung, fine], time.time(), time.monotonic() + 0.5)
    assert calls.count("nccl.21.log") == 1 and again[(21, 1)].log is None
    release.set()
    reads[(21, 1)].reading.join(10)
    assert reader.ranks[(21, 1)].log is not None and not reader.ranks[(21, 1)].stuck_for(
        time.monotonic())
