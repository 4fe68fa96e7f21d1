"""The PID watch polls slowly when it can miss nothing: with a pidfd held of every process it
follows (exits wake it at once) or with none followed, once a second; every `interval` while a
process can be seen to end only by polling.  Real processes, this machine's /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from llmmon.ranks.liveness import HELD_POLL, PidWatch, pidfd_exit_status
from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS
from tests.helpers import wait_for

INTERVAL = 0.1


class CountedWatch(PidWatch):
    """The real watch, noting when its thread polls."""

    def __init__(self, procfs: RootedFS) -> None:
        super().__init__(procfs, INTERVAL)
        self.polled: list[float] = []

    def poll(self, now: float | None = None) -> None:
        self.polled.append(time.monotonic())
        super().poll(now)


class LateWatch(CountedWatch):
    """The real watch, whose thread cannot poll while `late` is clear: a loaded node on which
    it wakes after the parent has reaped the process."""

    def __init__(self, procfs: RootedFS) -> None:
        super().__init__(procfs)
        self.late = threading.Event()
        self.late.set()

    def poll(self, now: float | None = None) -> None:
        self.late.wait()
        super().poll(now)


def start_ticks(pid: int) -> int:
    stat = procstat.read(RootedFS("/proc"), pid)
    assert stat is not None, pid
    return stat.start_ticks


def test_a_watch_holding_every_pidfd_polls_once_a_second_and_still_sees_an_exit_at_once(
        tmp_path: Path) -> None:
    watch = CountedWatch(RootedFS("/proc"))
    watch.start()
    child = subprocess.Popen(["sleep", "600"])
    try:
        assert watch.timeout() == HELD_POLL  # a node between jobs
        key = ("job", 0, child.pid)
        watch.follow({key: start_ticks(child.pid)})
        # seen at once (follow wakes it), then its pidfd held: nothing left to poll fast for
        wait_for(lambda: watch.timeout() == HELD_POLL and (p := watch.get(key)) and p.visible,
                 30, "the child seen and its pidfd held")
        before = len(watch.polled)
        wait_for(lambda: len(watch.polled) >= before + 4, 60, "three more polls")
        polls = watch.polled[before:]
        # a loaded machine only stretches the gaps: at `interval` they would be 0.1 s
        assert min(b - a for a, b in zip(polls, polls[1:])) >= HELD_POLL / 2, polls
        child.kill()
        seen = wait_for(lambda: (p := watch.get(key)) and p.gone_at and p, 30,
                        "the child seen gone through its pidfd")
        assert seen.exit_status == -9, seen  # read while a zombie: nobody has reaped it yet
    finally:
        child.kill()
        child.wait(30)
        watch.close()


def test_a_process_seen_only_through_another_procfs_is_polled_every_interval(
        tmp_path: Path) -> None:
    # --path.procfs of another PID namespace: its numbers name other processes here, so no
    # pidfd is held and only the poll can see the end
    child = subprocess.Popen(["sleep", "600"])
    procfs, pid = tmp_path / "proc", 4999999  # above the largest pid_max (2**22): no such pid
    (procfs / str(pid)).mkdir(parents=True)
    shutil.copy(f"/proc/{child.pid}/stat", procfs / str(pid) / "stat")
    watch = CountedWatch(RootedFS(str(procfs)))
    watch.start()
    try:
        key = ("job", 0, pid)
        watch.follow({key: start_ticks(child.pid)})
        wait_for(lambda: (p := watch.get(key)) and p.visible, 30, "the process seen")
        assert watch.timeout() == INTERVAL
        before = len(watch.polled)
        wait_for(lambda: len(watch.polled) >= before + 4, 60, "three more polls")
        (procfs / str(pid) / "stat").unlink()
        wait_for(lambda: (p := watch.get(key)) and p.gone_at, 30, "the process seen gone")
        assert watch.get(key).exit_status is None  # no zombie to read in that tree
    finally:
        child.kill()
        child.wait(30)
        watch.close()


def test_a_killed_process_its_parent_reaped_before_the_watch_woke_keeps_its_signal() -> None:
    # torchrun reaps a dead worker within 0.1 s; a watch thread that wakes later (a CPU hog
    # beside four ranks on two cores) finds no zombie to read, and a SIGKILLed rank read like the
    # ranks torchrun tore down after it.  The pidfd it holds keeps the status (Linux 6.15).
    watch = LateWatch(RootedFS("/proc"))
    watch.start()
    child = subprocess.Popen(["sleep", "600"])
    try:
        key, start = ("job", 0, child.pid), start_ticks(child.pid)
        watch.follow({key: start})
        wait_for(lambda: watch.timeout() == HELD_POLL and (p := watch.get(key)) and p.visible,
                 30, "the child seen and its pidfd held")
        watch.late.clear()
        child.kill()
        assert child.wait(30) == -9  # reaped: /proc holds nothing of it any more
        after = procstat.read(RootedFS("/proc"), child.pid)
        assert after is None or after.start_ticks != start, after  # (or another process's)
        watch.late.set()
        seen = wait_for(lambda: (p := watch.get(key)) and p.gone_at and p, 30,
                        "the child seen gone after its reap")
        assert seen.exit_status == -9, (seen, f"kernel {os.uname().release}: PIDFD_INFO_EXIT "
                                        "needs Linux 6.15")
    finally:
        watch.late.set()
        child.kill()
        child.wait(30)
        watch.close()


def test_a_pidfd_gives_no_status_while_its_process_runs_and_the_code_after_a_reap() -> None:
    child = subprocess.Popen(["sh", "-c", "read line; exit 7"], stdin=subprocess.PIPE)
    fd = os.pidfd_open(child.pid)
    try:
        assert pidfd_exit_status(fd) is None
        child.communicate(b"\n", timeout=30)
        assert child.returncode == 7
        assert pidfd_exit_status(fd) == 7, f"kernel {os.uname().release}: needs Linux 6.15"
    finally:
        os.close(fd)
