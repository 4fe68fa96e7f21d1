"""The suite's own guard (tests/conftest.py): a process a module leaves running is found."""

from __future__ import annotations

import os
import subprocess
import time

from tests.helpers import descendants


def test_a_grandchild_left_running_is_found_and_a_reaped_one_is_not() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    try:
        deadline = time.monotonic() + 30  # the shell forks its sleep a moment after it starts
        while True:
            found = dict(descendants(os.getpid()))
            if any(cmd.startswith("sleep 300") for cmd in found.values()):
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.05)
        assert shell.pid in found
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()
    assert shell.pid not in dict(descendants(os.getpid()))
