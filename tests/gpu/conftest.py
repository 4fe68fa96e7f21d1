"""GPU test fixtures: the real H200 capture, the 8-GPU replay fixture and the cgroup tree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from llmmon.collectors.gpu import GpuCollector
from tests.conftest import FIXTURES
from tests.core.helpers import make_collector

CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_snapshot.json"
TRACE = FIXTURES / "nvml" / "h200" / "nvml_trace_load.json"
H200X8 = FIXTURES / "nvml" / "h200x8"
PROC = FIXTURES / "gpu" / "proc"
NO_XIDS = FIXTURES / "gpu" / "kmsg" / "no_xids"  # a kernel log without XIDs: not the host's


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a replay file atomically, as the simulator does."""
    doc = json.loads(path.read_text())
    change(doc)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(doc))
    temporary.replace(path)


@pytest.fixture
def h200x8(tmp_path: Path) -> Path:
    """A private copy of the 8-GPU fixture that a test may edit."""
    return Path(shutil.copytree(H200X8, tmp_path / "h200x8"))


@pytest.fixture
def gpu_collector() -> Iterator[Callable[..., GpuCollector]]:
    """Build GpuCollectors over replay files and the cgroup tree; closed after the test."""
    built: list[GpuCollector] = []

    def build(fake: Path | str, **options: object) -> GpuCollector:
        options.setdefault("kmsg_path", str(NO_XIDS))
        collector = make_collector(GpuCollector, PROC, settings={"nvml.replay": str(fake)},
                                   **options)
        assert isinstance(collector, GpuCollector)
        built.append(collector)
        return collector

    yield build
    for collector in built:
        collector.close()
