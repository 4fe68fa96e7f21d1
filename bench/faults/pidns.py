"""A PID namespace with its own /proc: one simulated node's processes, as its daemon sees them.

On a real node the daemon (hostPID) sees that node's processes and no other's.  Simulated
nodes on one machine share its PID namespace, so a daemon that finds training ranks in procfs
would find every node's; each simulated node's daemon and jobs therefore run in a namespace of
their own.  Its init is `sleep infinity` under `unshare --pid --fork --mount-proc`; processes
join with `nsenter --pid --mount` (the mount namespace holds the namespace's /proc), or with
`--pid` alone.  Killing
the init kills everything in the namespace, which is how it is torn down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class PidNamespace:
    def __init__(self) -> None:
        self.holder: subprocess.Popen[bytes] | None = None
        self.init = 0  # host pid of the namespace's pid 1

    def __enter__(self) -> PidNamespace:
        self.holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 30
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children")
        while time.monotonic() < deadline:
            found = children.read_text().split() if children.exists() else []
            if found and self._inside(int(found[0])):
                self.init = int(found[0])
                return self
            if self.holder.poll() is not None:
                break
            time.sleep(0.02)
        self.__exit__()
        raise RuntimeError("unshare --pid --fork --mount-proc did not start a namespace "
                           "(the bench needs root)")

    def _inside(self, pid: int) -> bool:
        """The child has entered the new namespace (it is pid 1 there, and runs sleep)."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            return Path(f"/proc/{pid}/comm").read_text().strip() == "sleep" and any(
                line.split()[-1] == "1" for line in status.splitlines()
                if line.startswith("NSpid:"))
        except OSError:
            return False

    def command(self, argv: list[str], mount: bool = True) -> list[str]:
        """`argv` run inside the namespace, and its mount namespace (for its /proc) unless
        `mount` is off: a process that must keep the host's mounts (`ip netns exec` finds
        network namespaces there) joins the PID namespace alone."""
        return ["nsenter", "--target", str(self.init), "--pid", *(["--mount"] if mount else []),
                "--", *argv]

    def host_pid(self, pid: int) -> int | None:
        """The host's number of the namespace's process `pid`, None when there is none."""
        try:
            ours = os.readlink(f"/proc/{self.init}/ns/pid")
        except OSError:
            return None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ours:
                    continue
                for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                    if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                        return int(entry)
            except (OSError, ValueError):
                continue
        return None

    def __exit__(self, *exc: object) -> None:
        if self.init:
            try:
                os.kill(self.init, signal.SIGKILL)  # the kernel kills the rest of the namespace
            except ProcessLookupError:
                pass
        if self.holder is not None:
            try:
                self.holder.wait(10)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait(10)
