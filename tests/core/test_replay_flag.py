"""`llmmon serve --replay ARCHIVE` serves an `llmmon capture` bundle as the node served it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import requests

from tests.conftest import FIXTURES, ROOT
from tests.core.test_http import masked

NODE = ("--collector.disable-defaults", "--collector.disk", "--collector.gpu",
        f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}",
        f"--fake-nvml={FIXTURES / 'nvml' / 'h200x8'}")
STATIC = ("llmmon_disk_", "llmmon_gpu_info", "llmmon_gpu_power_limit_watts",
          "llmmon_gpu_memory_bytes", "llmmon_gpu_clock_max_hertz")


def static_lines(text: str) -> list[str]:
    return [line for line in masked(text).splitlines() if line.startswith(STATIC)]


def test_serve_replays_a_capture(serve, tmp_path: Path) -> None:
    archive = tmp_path / "node.tar.gz"
    subprocess.run([sys.executable, "-m", "llmmon", "capture", f"--output={archive}", *NODE],
                   check=True, capture_output=True, timeout=120, cwd=ROOT)
    live = serve(*NODE)
    live.wait_collected()
    replayed = serve(f"--replay={archive}")
    states = {s["name"]: s["status"] for s in replayed.wait_collected()}
    assert states == {"disk": "ok", "gpu": "ok"}
    expected = static_lines(requests.get(live.url + "/metrics", timeout=5).text)
    assert len(expected) > 100
    assert static_lines(requests.get(replayed.url + "/metrics", timeout=5).text) == expected


def test_a_bad_archive_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "junk.tar.gz").write_bytes(b"not a tar")
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve",
                             f"--replay={tmp_path / 'junk.tar.gz'}"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2 and result.stderr.startswith("llmmon serve: ")
