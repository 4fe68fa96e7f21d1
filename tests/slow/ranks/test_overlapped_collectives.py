"""Collectives in flight together: gloo completes them out of order and its pg_status
`last_completed_collective` stays behind for good once the job stops issuing (torch 2.13).
The ring says they are done; an idle group must not read as waiting in a collective, and every
record must be counted."""

from __future__ import annotations

import json
from pathlib import Path

from llmmon_reporter.layout import RANK_PREFIX
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, by_rank, job_doc, make_collector, scrape

STEPS = 10
BUCKET = 8 << 20  # floats all-reduced asynchronously each step, while the gradients' run
GRAD_ELEMENTS = 64 * 64 + 64


def _states(spool: Path) -> list[dict]:
    """Every rank's state file as the reporter wrote it."""
    return [json.loads(p.read_bytes()) for p in spool.rglob(f"{RANK_PREFIX}*.json")
            if not p.name.endswith(".entries.json")]


def test_an_idle_group_whose_collectives_completed_out_of_order_is_settled_not_waiting(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    args = ["--steps", str(STEPS), "--overlap", str(BUCKET), "--hold", "600"]
    final = 3 * STEPS  # the bucket, the weight's and the bias' all-reduce per step
    with Job(tmp_path, 2, args, base_env(LLMMON_SPOOL=str(spool))) as job:
        for rank in range(2):
            job.result(rank)  # training done: the group is idle from here on
        seen: dict = {}

        def settled() -> dict | None:
            samples = scrape(collector)[0]
            seen["completed"] = by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0")
            seen["float"] = by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0",
                                    coll="all_reduce", dtype="Float")
            seen["bf16"] = by_rank(samples, "llmmon_nccl_collective_bytes_total", pg="0",
                                   coll="all_reduce", dtype="BFloat16")
            doc = job_doc(collector)
            seen["inflight"] = {r["rank"]: r["groups"]["0"]["oldest_inflight_age_seconds"]
                                for r in doc["ranks"]} if doc else None
            ok = seen["completed"] == {0: final, 1: final} \
                and seen["float"] == {r: STEPS * BUCKET * 4 for r in range(2)} \
                and seen["bf16"] == {r: STEPS * GRAD_ELEMENTS * 2 for r in range(2)}
            return doc if ok else None

        try:
            doc = wait_for(settled, 120, "every rank's group 0 settled at the last collective")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read {seen}\n{job.logs()}") from None
        group = next(g for g in doc["groups"] if g["pg"] == "0")
        # settled: nothing in flight, nobody waits (both ranks sleep in --hold: once that
        # outlasts the learned threshold the group is the quiet kind of stalled, nothing else)
        assert group["op"] is None and group["waiting"] == [] and group["behind"] == [], group
        assert not group["stalled"] or group["quiet_ranks"] == [0, 1], group
        assert "nothing in flight" in group["summary"] and "last completed #30" in \
            group["summary"], group["summary"]
        # The reporter's own view agrees: not stuck, so it stopped reading the ring for
        # in-flight records, and says what it settled; torch's own number is still behind
        # (else this test no longer shows the lag).
        states = wait_for(lambda: (s := _states(spool)) and all(
            d["inflight"] is None and d["settled"].get("0") == final for d in s) and s, 60,
            "both reporters to settle group 0 and drop their in-flight reads")
        raw = [int(d["status"]["pg_status"]["0"]["last_completed_collective"]) for d in states]
        assert len(states) == 2 and min(raw) < final, raw
