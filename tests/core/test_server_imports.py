"""What the server process imports: the collector modules (for their flags), not what only the
collector process uses.  pyroute2 is imported on first use, by one thread at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import pythonpath

SERVER = r"""
import json, sys
import llmmon.cli, llmmon.serve.supervisor, llmmon.serve.app, llmmon.serve.httpserver
from llmmon.collectors import discover
from llmmon.config import add_serve_arguments
import argparse
add_serve_arguments(argparse.ArgumentParser(), discover())
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "pyroute2")))
"""

# Eight threads reach pyroute2 for the first time together, as collector threads do.
THREADS = r"""
import json, threading
from llmmon.sources import netlink, pyroute
barrier, errors = threading.Barrier(8), []
def first_use(index):
    barrier.wait()
    try:
        if index % 2:
            netlink.Rtnetlink().links()
        else:
            pyroute.module("pyroute2.ethtool.ioctl").IoctlEthtool
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
threads = [threading.Thread(target=first_use, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(errors))
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": pythonpath()})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_server_side_imports_no_pyroute2() -> None:
    assert _run(SERVER) == []


def test_threads_that_first_use_pyroute2_together_all_get_it() -> None:
    assert _run(THREADS) == []
