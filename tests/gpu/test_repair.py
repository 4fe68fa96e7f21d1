"""GPU memory repair states through the real collector, from the replay files of
tests/fixtures/nvml/repair (one state per GPU, built from the H200 capture)."""

from __future__ import annotations

from tests.conftest import FIXTURES
from tests.core.helpers import run

REPAIR = FIXTURES / "nvml" / "repair"


def test_each_repair_state_is_exported(gpu_collector) -> None:
    samples, ctx, _ = run(gpu_collector(REPAIR))
    assert ctx.errors == {}

    def by_gpu(name: str, **extra: str) -> dict[str, float]:
        return {dict(labels)["gpu"]: value for (metric, labels), value in samples.items()
                if metric == name and extra.items() <= dict(labels).items()}

    assert by_gpu("llmmon_gpu_row_remap_pending") == {
        "0": 0, "1": 1, "2": 0, "3": 0, "4": 0, "5": 0}
    assert by_gpu("llmmon_gpu_row_remap_failure") == {
        "0": 0, "1": 0, "2": 1, "3": 0, "4": 0, "5": 0}
    assert by_gpu("llmmon_gpu_recovery_action") == {
        "0": 0, "1": 0, "2": 0, "3": 2, "4": 0, "5": 3}
    assert by_gpu("llmmon_gpu_ecc_errors_total", severity="uncorrected", scope="volatile") == {
        "0": 0, "1": 1, "2": 3, "3": 0, "4": 2, "5": 0}
    assert by_gpu("llmmon_gpu_remapped_rows", cause="uncorrectable") == {
        "0": 0, "1": 1, "2": 8, "3": 0, "4": 2, "5": 0}


FABRIC = FIXTURES / "nvml" / "fabric"


def test_each_fabric_state_is_exported(gpu_collector) -> None:
    samples, ctx, _ = run(gpu_collector(FABRIC))
    assert ctx.errors == {}

    def by_gpu(name: str) -> dict[str, float]:
        return {dict(labels)["gpu"]: value for (metric, labels), value in samples.items()
                if metric == name}

    assert by_gpu("llmmon_gpu_fabric_state") == {"0": 3, "1": 2, "2": 1, "3": 3, "4": 3}
    assert by_gpu("llmmon_gpu_fabric_status") == {"0": 0, "3": 0, "4": 999}  # once completed
    assert by_gpu("llmmon_gpu_fabric_degraded_bandwidth") == {"0": 0, "3": 1, "4": 0}


def test_no_fabric_series_without_nvswitch(gpu_collector) -> None:
    """The H200 capture's driver answers no fabric call: nothing, and no error."""
    samples, ctx, _ = run(gpu_collector(REPAIR))
    assert ctx.errors == {}
    assert not [name for name, _ in samples if name.startswith("llmmon_gpu_fabric_")]
