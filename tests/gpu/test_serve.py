"""`llmmon serve --fake-nvml`: a real server over replayed GPUs, healthy and with a hung call."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.conftest import FIXTURES
from tests.gpu.conftest import H200X8, PROC, edit

GPU_ONLY = ("--collector.disable-defaults", "--collector.gpu", f"--path.procfs={PROC}")


def test_fake_nvml_flag_serves_the_fixture(serve) -> None:
    server = serve(*GPU_ONLY, f"--fake-nvml={H200X8}", "--collector.gpu.power-sample-rate=10")
    (state,) = server.wait_collected()
    assert state["status"] == "ok" and state["message"] == "watching 8 GPUs", state
    body = requests.get(server.url + "/metrics", timeout=5).text
    assert body.count("llmmon_gpu_up{") == 8
    assert 'llmmon_exporter_collector_success{collector="gpu"} 1.0' in body
    api = requests.get(server.url + "/api/v1/gpu", timeout=5).json()
    assert api["source"] == f"replay:{H200X8}"
    assert [g["up"] for g in api["gpus"]] == [True] * 8


def test_hung_nvml_call_behind_a_real_server(serve, h200x8: Path) -> None:
    edit(h200x8 / "gpu6.json", lambda doc: doc["device0"].update(memory_info_v2={"hang": True}))
    server = serve("--collector.disable-defaults", "--collector.gpu", "--collector.disk",
                   f"--path.procfs={FIXTURES / 'proc'}", f"--fake-nvml={h200x8}",
                   "--collector.gpu.timeout=300ms")
    states = {s["name"]: s for s in server.wait_collected()}
    assert states["gpu"]["status"] == "failed" and "timed out" in states["gpu"]["last_error"]
    assert states["disk"]["status"] == "ok"
    for _ in range(20):  # scrapes never wait on the blocked NVML call
        body = requests.get(server.url + "/metrics", timeout=2).text
        assert 'llmmon_exporter_collector_success{collector="gpu"} 0.0' in body
        assert "llmmon_disk_reads_total" in body
    assert requests.get(server.url + "/api/v1/gpu", timeout=2).status_code == 200
