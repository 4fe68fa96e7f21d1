"""When a job that slows evenly is blamed on the network, and when it is not: the verdict over
the groups' paces as the daemon computes them (the real two-node case with a degraded link is
tests/slow/faults/test_faults.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmmon.collectors.ranks import RanksCollector
from llmmon.metrics import Families
from llmmon.ranks import dimension, slowdown, stall, validate
from llmmon.ranks.ledger import Enqueued, Ledger, RankTrack
from llmmon.ranks.netns import Loss
from tests.conftest import FIXTURES

LOSSY = Loss("job-node-b", retransmitted=7246, sent=34581, seconds=30.0)


def _group(pg: str, recent: float, baseline: float | None, stalled: bool = False,
           inside: tuple[float, float] | None = None, size: int = 4) -> dict[str, Any]:
    pace = slowdown.GroupPace(recent, "status", baseline, 2, *(inside or (None, None)))
    return {"pg": pg, "stalled": stalled, "gap": pace.json(), "size": size,
            "local_ranks": [0, 1]}


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


def _track(gaps: list[float], reports: tuple[tuple[float, int], ...] = (),
           inflight: tuple[bool, ...] = ()) -> RankTrack:
    return next(iter(_ledger(gaps, reports, inflight).tracks.values()))


def _ledger(gaps: list[float], reports: tuple[tuple[float, int], ...] = (),
            inflight: tuple[bool, ...] = ()) -> Ledger:
    """Rank 0 of the nccl4 fixture through the real ledger: its Flight Recorder index of group
    0 holds collectives `gaps` apart from T0; `reports` are its status reports (time, last
    enqueued), each observed as the daemon observes a state file, with a collective in flight
    where `inflight` says so (none where it says nothing)."""
    state = validate.parse_state(STATE.read_bytes(), validate.Notes())
    ledger = Ledger(8, 8)
    for i, (at, enqueued) in enumerate(reports or ((T0, 0),)):
        busy = i < len(inflight) and inflight[i]
        progress = {"0": dataclasses.replace(next(iter(state.progress.values())),
                                             enqueued=enqueued, started=enqueued - busy,
                                             completed=enqueued - busy)}
        ledger.observe_state(dataclasses.replace(state, written_ns=int(at * 1e9),
                                                 progress=progress), at, at)
    track = next(iter(ledger.tracks.values()))
    times = [T0 + sum(gaps[:i]) for i in range(len(gaps) + 1)]
    track.index["0"] = {seq: Enqueued(int(t * 1e9), "all_reduce", "Float", 256)
                        for seq, t in enumerate(times)}
    return ledger


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


def test_the_status_reports_tell_where_the_added_time_is_spent() -> None:
    # 100 s of 0.2 s steps, then 20 s at 1 s a collective; the daemon read the status every
    # 5 s. The baseline is the 30 s before the last ring gaps (end - 32 to end - 2): 1 of its 6
    # reports had a collective in flight (the 6 older ones, all in flight, are another window);
    # 3 of the 4 reports of the last 20 s had one
    gaps = [0.2] * 500
    end = T0 + sum(gaps)
    before = tuple((end - 60 + 5 * i, 200 + 25 * i) for i in range(12))
    recent = tuple((end + 5 + 5 * i, 500 + 5 * i) for i in range(4))
    track = _track(gaps, before + recent,
                   (True,) * 6 + (True,) + (False,) * 5 + (True, True, False, True))
    found = slowdown.group_pace([track], "0", end + 21)
    assert found is not None and found.recent == pytest.approx(1.0)
    assert found.baseline == pytest.approx(0.2)
    assert (found.inside, found.inside_before) == (pytest.approx(0.75), pytest.approx(1 / 6))
    # of the 0.8 s added per collective, 0.75 * 1.0 - 0.2 / 6 is spent inside collectives
    assert found.added_inside == pytest.approx((0.75 - 0.2 / 6) / 0.8)
    assert found.json()["added_inside_share"] == 0.896


def test_the_verdict_and_the_gauge_the_rules_read_say_the_same() -> None:
    # the whole daemon path over the ledger: /api/v1/ranks' slowdown and the exported share
    gaps = [0.2] * 500
    end = T0 + sum(gaps)
    reports = tuple((end - 60 + 5 * i, 200 + 25 * i) for i in range(12)) + tuple(
        (end + 5 + 5 * i, 500 + 5 * i) for i in range(4))
    ledger = _ledger(gaps, reports, (False,) * 12 + (True, True, True, False))
    judged = stall.judge(ledger, end + 21, stall.StallThresholds(stale_after=60.0,
                                                                 stall_after=600.0)).jobs[0]
    job = judged.json()
    assert "suspect the network" in job["slowdown"]["cause"], job["slowdown"]
    families = Families()
    RanksCollector._judged_families(families, judged)
    exported = {m.name: m.samples for m in families}
    assert [(s.labels["pg"], s.value) for s in
            exported["llmmon_nccl_collective_gap_inside_ratio"]] == [("0", 0.937)]


def test_too_few_reports_give_no_share() -> None:
    gaps = [0.2] * 500
    end = T0 + sum(gaps)
    reports = tuple((end - 60 + 5 * i, 200 + 25 * i) for i in range(12)) + (
        (end + 10, 505), (end + 20, 515))
    found = slowdown.group_pace([_track(gaps, reports, (True,) * 14)], "0", end + 21)
    assert found is not None and found.inside is None and found.added_inside is None


def test_time_added_inside_the_collectives_blames_the_network_without_loss() -> None:
    found = slowdown.verdict("job", [_group("0", 0.7, 0.21, inside=(0.7, 0.05))], {}, None)
    assert found is not None and found["cause"] == found["summary"]
    assert found["gap"]["added_inside_share"] == 0.979
    assert "had a collective in flight in 70% of their status reports over the last 20 s, " \
        "5% before: 98% of the added time is spent inside the collectives, waiting for data" \
        in found["cause"]
    assert ": suspect the network between the nodes (a slow or congested link; no TCP loss " \
        "seen), not a rank here or the input pipeline; a rank on another node" in found["cause"]


def test_time_added_before_the_collectives_is_not_the_network_even_with_loss() -> None:
    found = slowdown.verdict("job", [_group("0", 0.8, 0.2, inside=(0.05, 0.2))], {}, LOSSY)
    assert found is not None and found["cause"] == found["summary"]
    assert "TCP segments" not in found["cause"] and "suspect the network" not in found["cause"]
    assert "the rest before them, every rank late together: suspect what they all do between " \
        "collectives (the input pipeline, the step's compute, every GPU's clocks), not the " \
        "network; this node's ranks only: if the other nodes' ranks wait inside the " \
        "collectives, the ranks here are the late ones" in found["cause"]
    alone = slowdown.verdict("job", [_group("0", 0.8, 0.2, inside=(0.05, 0.2), size=2)], {},
                             None)
    assert alone is not None and alone["cause"].endswith("every GPU's clocks), not the network")


def test_a_group_on_one_node_is_not_the_network_between_nodes() -> None:
    found = slowdown.verdict("job", [_group("0", 0.7, 0.21, inside=(0.9, 0.05), size=2)], {},
                             None)
    assert found is not None and "suspect the transport between this node's ranks" in \
        found["cause"] and "another node" not in found["cause"]


def test_time_split_inside_and_before_claims_no_cause() -> None:
    found = slowdown.verdict("job", [_group("0", 0.7, 0.2, inside=(0.4, 0.1))], {}, None)
    assert found is not None and found["cause"] is None
    assert found["gap"]["added_inside_share"] == 0.52


@pytest.mark.parametrize("inside, added", [
    ((0.95, 0.9), None),  # NCCL: in flight before too (the CPU runs ahead): a high share is moot
    ((0.2, 0.9), 0.0),  # ... but a fall is read: the ranks now wait before the collectives
])
def test_a_group_in_flight_most_of_the_time_before_is_read_only_when_it_falls(
        inside: tuple[float, float], added: float | None) -> None:
    pace = slowdown.GroupPace(0.8, "status", 0.2, 2, *inside)
    assert pace.added_inside == added


@pytest.mark.parametrize("desc,dim,kind", [
    ("mesh_tp", "tp", "tensor"), ("mesh_dp_shard", "dp_shard", "data"),
    ("mesh_dp_replicate", "dp_replicate", "data"), ("mesh_pp", "pp", "pipeline"),
    ("mesh_ep", "ep", "expert"), ("mesh_cp", "cp", "context"), ("default_pg", "world", "world"),
    ("pair", "pair", "")])
def test_a_group_is_named_by_the_mesh_dimension_it_carries(desc: str, dim: str,
                                                            kind: str) -> None:
    assert dimension.of(desc) == dim and dimension.kind(dim) == kind


def test_a_slow_tensor_parallel_group_points_at_nvlink_and_a_slow_dp_one_at_the_network(
        ) -> None:
    """The seed's rule: tensor parallel stays inside a node, the other dimensions cross it."""
    tp = {**_group("3", 0.7, 0.21, inside=(0.7, 0.05), size=2), "dimension": "tp"}
    found = slowdown.verdict("job", [tp], {}, None)
    assert "group 3 (tp)" in found["summary"] and "NVLink" in found["summary"], found
    dp = {**_group("1", 0.7, 0.21, inside=(0.7, 0.05)), "dimension": "dp_shard"}
    found = slowdown.verdict("job", [dp], {}, None)
    assert "group 1 (dp_shard)" in found["summary"], found
    assert "the network between the nodes" in found["summary"], found
