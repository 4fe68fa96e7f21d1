"""Shared test setup: fixture paths, the tiers, a real `llmmon serve` subprocess, and the
check that no module leaves a process running."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from tests.helpers import descendants, free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "tests" / "golden"
REGEN = os.environ.get("LLMMON_REGEN_GOLDEN") == "1"
SLOW = ROOT / "tests" / "slow"


# This checkout's packages first on every path, for pytest and for every child it starts: the
# suite tests the tree it runs from, also in a second worktree while the editable install points
# at another.
SOURCES = [str(ROOT / "exporter"), str(ROOT / "reporter")]
for _source in reversed(SOURCES):
    if _source not in sys.path:
        sys.path.insert(0, _source)
os.environ["PYTHONPATH"] = os.pathsep.join(
    SOURCES + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and p not in SOURCES])


def pythonpath() -> str:
    """PYTHONPATH for a child that imports llmmon and the tests' helpers from this checkout."""
    return os.pathsep.join(SOURCES + [str(ROOT)])


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The folder is the tier: every test under tests/slow is `slow` and no other may be, so
    `-m "not slow"` leaves out exactly what is there and no hand-set marker hides elsewhere."""
    misplaced = []
    for item in items:
        if item.path.is_relative_to(SLOW):
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("slow"):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("marked slow outside tests/slow (move them there): "
                                + ", ".join(misplaced))


def markdown_sections(page: Path) -> dict[str, str]:
    """Each heading's GitHub anchor (lower case, punctuation but `-` and `_` dropped, spaces to
    hyphens) and the text under it; lines of fenced code blocks are never headings."""
    sections: dict[str, str] = {}
    anchor, fenced = None, False
    for line in page.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            anchor = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            sections[anchor] = ""
        elif anchor is not None:
            sections[anchor] += line + "\n"
    return sections


def compare_golden(name: str, actual: str) -> None:
    """Compare in full with tests/golden/<name>; LLMMON_REGEN_GOLDEN=1 rewrites it on purpose."""
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run with LLMMON_REGEN_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"exposition differs from {path} (LLMMON_REGEN_GOLDEN=1 to accept)"


class ServeProcess:
    """A real `llmmon serve` process on 127.0.0.1, stopped by PID at the end.  It follows the
    reporter's ranks only (`--collector.ranks.discover=false`) unless the test says otherwise:
    it shares this machine's PID namespace with every other torch process here, which it would
    find and follow as ranks without the reporter; discovery is tested in PID namespaces of its
    own (tests/slow/ranks/test_outside_job.py, bench/faults/pidns.py)."""

    def __init__(self, args: list[str], log_path: Path, **popen: Any) -> None:
        if not any(a.startswith("--collector.ranks.discover") for a in args):
            args = [*args, "--collector.ranks.discover=false"]
        if not any(a.startswith("--collector.incidents.dir") for a in args):  # not the host's
            args = [*args, f"--collector.incidents.dir={log_path.parent / 'incidents'}"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmmon", "serve",
             f"--web.listen-address=127.0.0.1:{self.port}", *args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, **popen)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"llmmon serve exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"llmmon serve not ready after {timeout}s:\n{self.log()}")

    def wait_collected(self, timeout: float = 60.0) -> list[dict]:
        """Wait until no collector is still pending its first run; returns their states. The list
        is empty until the collector process has reported once, so empty is not done."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = requests.get(self.url + "/api/v1/collectors", timeout=2).json()["collectors"]
            if states and all(s["status"] != "pending" for s in states):
                return states
            time.sleep(0.05)
        raise AssertionError(f"collectors still pending after {timeout}s: {states}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 60.0) -> str:
        """The log once it holds `text` (the server and its collector process both write)."""
        deadline = time.monotonic() + timeout
        while text not in (log := self.log()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged after {timeout}s:\n{log}")
            time.sleep(0.05)
        return log

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    """Start `llmmon serve ARGS...` (keywords go to Popen) and wait until it answers; stopped
    after the test."""
    servers: list[ServeProcess] = []

    def start(*args: str, **popen: Any) -> ServeProcess:
        server = ServeProcess(list(args), tmp_path / f"serve-{len(servers)}.log", **popen)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def nothing_left_running(request: pytest.FixtureRequest) -> None:
    """Each module starts with no process left by the ones before: the end-to-end stack once
    outlived its module and slowed every later test on a 2-core CI machine (load 30)."""
    left = descendants(os.getpid())
    for pid, _ in left:  # stopped, so that one leak fails one module, not all that follow
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running before {request.module.__name__}: {left}"


HOST_INCIDENTS = Path("/var/lib/llmmon/incidents")  # the incidents collector's default


def _host_incidents() -> set[str]:
    try:
        return {p.name for p in HOST_INCIDENTS.iterdir()}
    except OSError:
        return set()


@pytest.fixture(scope="module", autouse=True)
def no_incident_on_the_host(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module's daemons keep their incidents in its own directories: one at the default
    settings with a stalled fixture job once wrote one per test into this machine's."""
    before = _host_incidents()
    yield
    added = _host_incidents() - before
    assert not added, f"{request.module.__name__} wrote incidents into {HOST_INCIDENTS}: " \
                      f"{sorted(added)[:3]}; give its daemons --collector.incidents.dir"
