"""A rank whose process exits: reported stale (up 0, with its age), then dropped with its files."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, by_rank, make_collector, scrape


def test_an_exited_rank_goes_stale_then_disappears(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    collector = make_collector(spool, tmp_path, stale_after="1s", drop_after="4s")
    args = ["--steps", "10", "--behaviour", "exit", "--culprit", "2", "--hold", "30"]
    with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool))) as job:
        for rank in range(3):
            job.result(rank)
        assert wait_for(lambda: job.procs[2].poll() is not None, 30, "rank 2 to exit")

        def stale() -> dict | None:
            samples = scrape(collector)[0]
            up = by_rank(samples, "llmmon_rank_up")
            return samples if up == {0: 1, 1: 1, 2: 0} else None

        samples = wait_for(stale, 30, "rank 2 to be stale while 0 and 1 stay up")
        age = by_rank(samples, "llmmon_rank_report_age_seconds")
        assert age[2] > 1 and age[0] < 1 and age[1] < 1
        assert by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0")[2] == 10
        files = sorted(p.name for p in spool.rglob("rank_2.*"))
        assert len(files) == 2  # state and entries, still there while stale

        def dropped() -> dict | None:
            samples = scrape(collector)[0]
            return samples if set(by_rank(samples, "llmmon_rank_up")) == {0, 1} else None

        samples = wait_for(dropped, 30, "rank 2 to be dropped")
        assert 2 not in by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0")
        assert not list(spool.rglob("rank_2.*")), "the dropped rank's files are deleted"
        assert len(list(spool.rglob("rank_[01].*"))) == 4
