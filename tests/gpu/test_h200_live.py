"""The replay of a snapshot taken on a real H200 (bench/h200/gpu_check.sh; two cards, on
2026-11-30 and 2026-12-04) must export what the exporter exported live on that card, for every
value that does not move."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmmon.collector import Context
from llmmon.exposition import render
from tests.conftest import FIXTURES

# each capture with the collector options of its live run
CAPTURES = [(FIXTURES / "nvml" / "h200_live",
             {"power_limit_bounds": True, "peak_flops_dtypes": "bf16,fp16,fp8,tf32"}),
            (FIXTURES / "nvml" / "h200_live_2026-12-04", {})]  # the defaults
STATIC = {"llmmon_gpu_info", "llmmon_gpu_up", "llmmon_gpu_power_limit_watts",
          "llmmon_gpu_power_limit_bound_watts", "llmmon_gpu_clock_max_hertz",
          "llmmon_gpu_temperature_threshold_celsius", "llmmon_gpu_peak_flops",
          "llmmon_gpu_pcie_link_max_generation", "llmmon_gpu_pcie_link_max_width",
          "llmmon_gpu_remapped_rows", "llmmon_gpu_row_remap_pending",
          "llmmon_gpu_recovery_action"}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name in STATIC}


@pytest.mark.parametrize("live_dir, options", CAPTURES, ids=[c[0].name for c in CAPTURES])
def test_replayed_live_snapshot_matches_the_live_scrape(gpu_collector, live_dir: Path,
                                                        options: dict) -> None:
    live = samples((live_dir / "scrape.prom").read_text())
    assert len(live) >= 15
    collector = gpu_collector(live_dir / "gpu00.json", **options)
    replayed = samples(render(collector.collect(Context()))[0].decode())
    assert replayed == live
