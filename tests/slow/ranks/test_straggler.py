"""A straggler: rank 1 sleeps before every collective, so it enqueues each one late."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import wait_for
from tests.ranks.jobs import (Job, base_env, by_rank, make_collector, scrape, series,
                              watched_collector)

DELAY = 0.25  # rank 1's sleep before each collective: well above scheduling jitter


def test_the_late_rank_has_the_enqueue_lag(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path)
    args = ["--steps", "10", "--behaviour", "straggler", "--culprit", "1",
            "--sleep", str(DELAY), "--hold", "20"]
    with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool))) as job:
        for rank in range(3):
            job.result(rank, timeout=300)  # three torch imports on a loaded machine

        def lag_of_last_step() -> dict[int, float] | None:
            samples = scrape(collector)[0]
            done = by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0")
            lag = by_rank(samples, "llmmon_nccl_enqueue_lag_seconds", pg="0")
            return lag if done == {0: 20, 1: 20, 2: 20} and len(lag) == 3 else None

        lag = wait_for(lag_of_last_step, 30, "the enqueue lag of all three ranks")

    # Lags are against the median enqueue time: rank 1 is the one late, the later of the
    # punctual ranks is the median itself (exactly 0) and the other is not late at all.
    assert max(lag, key=lag.__getitem__) == 1 and lag[1] > 0
    assert sorted((lag[0], lag[2]))[1] == 0 and min(lag[0], lag[2]) <= 0


def test_a_straggler_alone_on_its_node_stands_out_at_the_same_mark_across_nodes(
        tmp_path: Path) -> None:
    # Rank 1 reports into another spool (another node's daemon) and sleeps 50 ms before each
    # all-reduce.  Each node's own enqueue lag compares only its ranks; the marks (the enqueue
    # time of the newest collective whose number is a multiple of 256) compare them all.
    other = tmp_path / "other"
    other.mkdir()
    (other / "spool").mkdir()
    args = ["--steps", "100000", "--hold", "300", "--timeout", "300", "--culprit", "1",
            "--behaviour", "straggler", "--sleep", "0.05",
            "--culprit-spool", str(other / "spool")]
    with watched_collector(tmp_path) as (spool, here):
        there = make_collector(other / "spool", other)
        with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="apart")):
            def marked() -> dict[str, tuple[str, float]] | None:
                marks = {dict(key)["rank"]: (dict(key)["seq"], value)
                         for collector in (here, there)
                         for key, value in series(scrape(collector)[0],
                                                  "llmmon_nccl_mark_enqueue_timestamp_seconds",
                                                  job_id="apart", pg="0").items()}
                seqs = {seq for seq, _ in marks.values()}
                return marks if len(marks) == 3 and len(seqs) == 1 else None
            marks = wait_for(marked, 400, "every rank's mark at one collective")
            lags = series(scrape(here)[0], "llmmon_nccl_enqueue_lag_seconds", job_id="apart",
                          pg="0")
    times = {rank: value for rank, (_, value) in marks.items()}
    assert int(marks["1"][0]) % 256 == 0
    assert times["1"] - max(times["0"], times["2"]) > 0.025, times  # 50 ms late, seen apart
    assert abs(times["0"] - times["2"]) < 0.05, times
    assert {dict(k)["rank"] for k in lags} == {"0", "2"}  # this node cannot see rank 1's lag
    assert all(abs(v) < 0.05 for v in lags.values()), lags
