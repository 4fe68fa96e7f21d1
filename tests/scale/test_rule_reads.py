"""bench/rule_reads.py: the series each shipped rule selects per node and minute."""

from __future__ import annotations

import sys

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import rule_reads  # noqa: E402  (a script, as bench/capacity.py)

RULES = sorted((ROOT / "alerts" / "rules").glob("*.yaml"))
# A node of 8 GPUs, up, with ECC counters of both severities and both scopes.
EXPOSITION = "".join(
    f'llmmon_gpu_up{{gpu="{g}",uuid="GPU-{g}"}} 1\n'
    + "".join(f'llmmon_gpu_ecc_errors_total{{gpu="{g}",uuid="GPU-{g}",severity="{s}",scope="{c}"}} 0\n'
              for s in ("corrected", "uncorrected") for c in ("volatile", "aggregate"))
    for g in range(8))


def _row(rows: list[dict], rule: str) -> dict:
    return next(row for row in rows if row["rule"] == rule)


def test_a_rule_counts_the_series_its_selectors_match_times_its_runs_a_minute() -> None:
    rows = rule_reads.rule_reads(RULES, rule_reads.node_series(EXPOSITION))
    lost = _row(rows, "GPULost")  # llmmon_gpu_up == 0, every 15 s
    assert (lost["per_evaluation"], lost["per_minute"]) == (8, 32)
    # severity="uncorrected": both scopes of each GPU; the volatile scope alone once a minute
    recent = _row(rows, "GPUEccUncorrectable (uncorrected_errors)")
    assert (recent["per_evaluation"], recent["per_minute"]) == (16, 64)
    since_boot = _row(rows, "GPUEccUncorrectableSinceBoot")
    assert (since_boot["per_evaluation"], since_boot["per_minute"]) == (8, 8)
    # a rule reading only recordings selects nothing of the node
    assert _row(rows, "LLMTrainingStraggler (collective_time)")["per_evaluation"] == 0
