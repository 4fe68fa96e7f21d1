"""A straggler: rank 1 sleeps before every collective, so it enqueues each one late."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ranks.jobs import Job, base_env, by_rank, make_collector, scrape, wait_for

pytestmark = pytest.mark.slow  # real multi-process torch jobs

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
