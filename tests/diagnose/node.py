"""A real exporter in-process over private copies of the fixture trees, with its Diagnoser.

The collectors, the sampler and the diagnoser are the daemon's own (llmmon.serve.assembly.build from
`llmmon serve` flags); tests edit the copied files between two observations the way the world
changes them (counters grow, replay files are rewritten), and read the report.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.config import build_settings
from llmmon.serve.assembly import Daemon, build
from llmmon.diagnose import Diagnoser
from tests.conftest import FIXTURES

SETTLE_TIMEOUT = 30.0
INTERVAL = "0.2s"


def edit_json(path: Path, change: Callable[[Any], None]) -> None:
    """Rewrite a JSON file atomically (temp file, rename), as the reporter and simulator do."""
    doc = json.loads(path.read_text())
    change(doc)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(doc))
    temporary.replace(path)


def touch_tree(root: Path) -> None:
    """Make every file fresh: spool files are judged by their age."""
    now = time.time()
    for directory, _, files in os.walk(root):
        for name in files:
            os.utime(Path(directory) / name, (now, now))


class Node:
    """Fixture copies under `root`; `start()` builds and starts the daemon over them."""

    def __init__(self, root: Path, sysfs: Path = FIXTURES / "sys",
                 nvml: Path = FIXTURES / "nvml" / "h200x8",
                 spool: Path | None = FIXTURES / "spool" / "nccl4") -> None:
        self.root = root
        self.sys = Path(shutil.copytree(sysfs, root / "sys", symlinks=True))
        self.proc = Path(shutil.copytree(FIXTURES / "proc", root / "proc"))
        self.nvml = Path(shutil.copytree(nvml, root / "nvml"))
        self.ethtool = Path(shutil.copytree(FIXTURES / "ethtool", root / "ethtool"))
        self.links = Path(shutil.copy(FIXTURES / "netlink" / "links.json", root / "links.json"))
        self.spool = root / "spool"
        if spool is not None:
            shutil.copytree(spool, self.spool)
        self.spool.mkdir(exist_ok=True)
        self.daemon: Daemon | None = None
        self.diagnoser: Diagnoser | None = None

    def edit_ranks(self, change: Callable[[Any, int], None], kind: str = "state") -> None:
        """Rewrite every rank's spool file of `kind` (state or entries): change(doc, rank)."""
        for path in sorted(self.spool.glob("*/rank_*.json")):
            if (".entries." in path.name) == (kind == "entries"):
                edit_json(path, lambda doc: change(doc, int(path.name.split(".")[0][5:])))

    def edit_gpu(self, index: int, change: Callable[[Any], None]) -> None:
        edit_json(self.nvml / f"gpu{index}.json", change)

    def uuid(self, index: int) -> str:
        doc = json.loads((self.nvml / f"gpu{index}.json").read_text())
        return str(doc["device0"]["uuid"]["ok"])

    def args(self) -> list[str]:
        flags = [f"--path.sysfs={self.sys}", f"--path.procfs={self.proc}",
                 f"--fake-nvml={self.nvml}", f"--ethtool.dumps={self.ethtool}",
                 f"--netlink.dump={self.links}", f"--spool.dir={self.spool}",
                 "--collector.ranks.stale-after=1h", "--collector.ranks.auto-dump=false",
                 f"--collector.ranks.fr-dir={self.root / 'fr'}",
                 f"--collector.ranks.pipe-dir={self.root / 'pipe'}",
                 f"--collector.incidents.dir={self.root / 'incidents'}"]
        return flags + [f"--collector.{cls.name}.interval={INTERVAL}" for cls in discover()]

    def start(self, *extra: str) -> Node:
        touch_tree(self.spool)
        settings = build_settings(build_parser().parse_args(["serve", *self.args(), *extra]),
                                  discover())
        self.daemon = build(settings)
        self.diagnoser = self.daemon.diagnoser  # the daemon's own, mounted on its app
        self.daemon.sampler.start()
        assert self.daemon.sampler.wait_first_cycle(SETTLE_TIMEOUT)
        return self

    def settle(self) -> None:
        """Wait until every collector has run twice since now: the second run began after any
        edit made before this call."""
        assert self.daemon is not None
        for _ in range(2):
            since = time.time()
            deadline = time.monotonic() + SETTLE_TIMEOUT
            states = self.daemon.sampler.states.values()
            while not all((s.last_success or 0) > since for s in states):
                assert time.monotonic() < deadline, {s.name: s.status for s in states}
                time.sleep(0.05)

    def observe(self) -> None:
        assert self.diagnoser is not None
        self.settle()
        self.diagnoser.observe()

    def report(self, change: Callable[[], None] | None = None,
               wait: float = 0.0) -> dict[str, Any]:
        """Observe, apply `change`, let `wait` seconds pass, observe again; the report."""
        assert self.diagnoser is not None
        self.observe()
        if change is not None:
            change()
        time.sleep(wait)
        self.observe()
        return self.diagnoser.result()

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.sampler.stop()


def check(report: dict[str, Any], path: str) -> dict[str, Any]:
    """The check `branch.check` of a report."""
    branch_id, check_id = path.split(".")
    branch = next(b for b in report["branches"] if b["id"] == branch_id)
    return next(c for c in branch["checks"] if c["id"] == check_id)


def texts(found: dict[str, Any]) -> str:
    return "\n".join(item["text"] for item in found["evidence"])


def subjects(found: dict[str, Any], label: str) -> set[str]:
    return {item["subject"][label] for item in found["evidence"] if label in item["subject"]}
