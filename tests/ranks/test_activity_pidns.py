"""The reporter meters its rank's main thread in a PID namespace that kept its parent's /proc
(`nsenter --pid` alone, as a rank that must keep the host's mounts is started; `unshare --pid`
without `--mount-proc`): gettid() there is not the thread's number in that /proc. Without its
activity a rank that works (a checkpoint) looks idle, and a long checkpoint pages as a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import pythonpath

METER = ("import json, threading; from llmmon_reporter.activity import Meter; "
         "m = Meter(); r = m.read(); "
         "print(json.dumps([threading.main_thread().native_id, m.tid, r is not None]))")


def test_the_main_thread_is_metered_in_a_pid_namespace_without_its_own_proc() -> None:
    assert os.geteuid() == 0, "unshare --pid needs root, as the rest of the suite"
    done = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", METER],
                          env={**os.environ, "PYTHONPATH": pythonpath()},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    native, metered, read = json.loads(done.stdout)
    assert native == 1  # pid 1 of the new namespace ...
    assert metered != native  # ... is another number in the parent's /proc
    assert read is True
