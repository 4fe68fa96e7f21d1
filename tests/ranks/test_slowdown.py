"""When a job that slows evenly is blamed on the network, and when it is not: the verdict over
the groups' paces as the daemon computes them (the real two-node case with a degraded link is
tests/faults/test_faults.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmmon.ranks import schema, slowdown
from llmmon.ranks.ledger import Enqueued, Ledger, RankTrack
from llmmon.ranks.netns import Loss
from tests.conftest import FIXTURES

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


# --- the pace, over real ledger tracks ------------------------------------------------------
STATE = FIXTURES / "spool" / "nccl4" / "llama-8b" / "rank_0.4101.json"
T0 = 1_800_000_000.0  # the job's first collective


def _track(gaps: list[float], reports: tuple[tuple[float, int], ...] = ()) -> RankTrack:
    """Rank 0 of the nccl4 fixture through the real ledger: its Flight Recorder index of group
    0 holds collectives `gaps` apart from T0; `reports` are its status reports (time, last
    enqueued), each observed as the daemon observes a state file."""
    state = schema.parse_state(STATE.read_bytes(), schema.Notes())
    ledger = Ledger(8, 8)
    for at, enqueued in reports or ((T0, 0),):
        progress = {"0": dataclasses.replace(next(iter(state.progress.values())),
                                             enqueued=enqueued)}
        ledger.observe_state(dataclasses.replace(state, written_ns=int(at * 1e9),
                                                 progress=progress), at, at)
    track = next(iter(ledger.tracks.values()))
    times = [T0 + sum(gaps[:i]) for i in range(len(gaps) + 1)]
    track.index["0"] = {seq: Enqueued(int(t * 1e9), "all_reduce", "Float", 256)
                        for seq, t in enumerate(times)}
    return track


def test_the_pace_now_comes_from_the_status_reports_and_is_compared_with_full_windows() -> None:
    # 0.05 s set-up collectives, then 0.2 s steps for 100 s; then the status says 11 of the
    # next collectives took 11 s (the ring, read every 20 s, has not caught up)
    gaps = [0.05] * 10 + [0.2] * 500
    end = T0 + sum(gaps)
    track = _track(gaps, ((end + 1, 509), (end + 6, 514), (end + 12, 520)))
    found = slowdown.group_pace([track], "0", end + 12.5)
    assert found is not None and found.basis == "status"
    assert found.recent == pytest.approx(11 / 11)
    # the oldest window (counted back from 20 s ago) holds the 0.05 s burst and 3 s of steps:
    # under half of its 30 s, left out (else the baseline would read 0.13 s)
    assert found.baseline == pytest.approx(0.2) and found.windows == 3
    assert found.ratio == pytest.approx(5.0)


def test_without_status_reports_the_ring_gives_the_pace_now() -> None:
    gaps = [0.2] * 300 + [1.0] * 10
    end = T0 + sum(gaps)
    found = slowdown.group_pace([_track(gaps)], "0", end + 1)
    assert found is not None and found.basis == "ring" and found.recent == pytest.approx(1.0)
    assert found.baseline == pytest.approx(0.2)


def test_an_idle_group_has_no_pace() -> None:
    gaps = [0.2] * 300
    assert slowdown.group_pace([_track(gaps)], "0", T0 + sum(gaps) + 31) is None
