"""Snapshots in the replay format: what a source answers, written back, replays the same."""

from __future__ import annotations

import json
from pathlib import Path

from llmmon.sources.nvml_snapshot import main
from tests.core.helpers import run
from tests.gpu.conftest import CAPTURE


def test_a_snapshot_of_the_capture_replays_identically(gpu_collector, tmp_path: Path) -> None:
    assert main([str(tmp_path / "snap"), f"--fake-nvml={CAPTURE}"]) == 0
    (written,) = sorted((tmp_path / "snap").iterdir())
    assert written.name == "gpu00.json"
    original, copy = json.loads(CAPTURE.read_text()), json.loads(written.read_text())
    for section in ("system", "field_values", "gpm"):
        assert copy[section] == original[section], section
    links = original["device0"].pop("nvlink")
    assert {k: v for k, v in copy["device0"].pop("nvlink").items() if k in links} == links
    # Calls newer than the capture (fabric_info) are recorded as the replay answers them.
    for call in set(copy["device0"]) - set(original["device0"]):
        assert copy["device0"].pop(call)["code"] == 3, call  # NVML_ERROR_NOT_SUPPORTED
    assert copy["device0"] == original["device0"]
    assert run(gpu_collector(written))[2] == run(gpu_collector(CAPTURE))[2]


def test_a_bad_source_is_reported_not_raised(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "nothing"), f"--fake-nvml={tmp_path / 'missing'}"]) == 1
    assert "no such replay file or directory" in capsys.readouterr().err
