"""When a job that slows evenly is blamed on the network, and when it is not: the verdict over
the groups' paces as the daemon computes them (the real two-node case with a degraded link is
tests/faults/test_faults.py)."""

from __future__ import annotations

from typing import Any

import pytest

from llmmon.ranks import slowdown
from llmmon.ranks.netns import Loss

LOSSY = Loss("job-node-b", retransmitted=7246, sent=34581, seconds=30.0)


def _group(pg: str, recent: float, baseline: float | None, stalled: bool = False
           ) -> dict[str, Any]:
    pace = slowdown.Pace(recent, "status", baseline, 2)
    return {"pg": pg, "stalled": stalled, "gap": pace.json()}


def test_an_even_fivefold_slowdown_with_tcp_loss_blames_the_network() -> None:
    found = slowdown.verdict("job", [_group("0", 1.07, 0.21), _group("1", 0.3, 0.2)],
                             {"0": {0: 0.001, 1: -0.001}}, LOSSY)
    assert found is not None and found["pg"] == "0" and found["gap"]["ratio"] == 5.1
    assert found["cause"] == found["summary"]
    assert found["cause"].startswith("job job runs 5.1x slower than its own pace: group 0 "
                                     "enqueues a collective every 1.07 s, every 0.21 s before")
    assert "21.0% of the TCP segments sent in the network namespace of job-node-b" in \
        found["cause"]
    assert found["cause"].endswith("suspect the network between the nodes (a lossy or "
                                   "congested link), not a rank")
    assert found["tcp"]["retransmitted"] == 7246


@pytest.mark.parametrize("loss", [
    None,  # the namespaces could not be read (no hostPID): no cause claimed
    Loss("host", retransmitted=30, sent=10_000, seconds=30.0),  # 0.3 %: a healthy path
    Loss("host", retransmitted=5, sent=100, seconds=30.0),  # 5 %, but 5 segments
])
def test_without_enough_tcp_loss_the_slowdown_is_shown_with_no_cause(loss: Loss | None) -> None:
    found = slowdown.verdict("job", [_group("0", 1.0, 0.2)], {}, loss)
    assert found is not None and found["cause"] is None
    assert "a rank on another node, or something all ranks share" in found["summary"]


@pytest.mark.parametrize("groups, lags", [
    ([_group("0", 0.35, 0.2)], {}),  # 1.75x: under the factor
    ([_group("0", 1.0, None)], {}),  # no earlier pace to compare with (a young job)
    ([_group("0", 1.0, 0.2, stalled=True)], {}),  # a hang is the hang verdict's
    ([_group("0", 1.0, 0.2)], {"0": {0: 0.0, 1: 0.15}}),  # rank 1 enqueues 15 % late
    ([{"pg": "0", "stalled": False, "gap": None}], {}),  # idle for 30 s
])
def test_no_slowdown_verdict(groups: list[dict[str, Any]], lags: dict) -> None:
    assert slowdown.verdict("job", groups, lags, LOSSY) is None
