"""The rank budget against spool files any local user can write: fake ranks that came first do
not keep a real job out once its processes are seen alive."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS
from llmmon_reporter import layout
from tests.ranks import hostile
from tests.ranks.jobs import make_collector, scrape, series


def _jobs(collector) -> dict[str, list[int]]:
    return {job["job_id"]: [r["rank"] for r in job["ranks"]]
            for job in collector.evidence()["jobs"]}


def test_ranks_seen_alive_take_the_places_of_fake_ranks_that_came_first(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    for job in ("aaa-fake", "aab-fake"):  # 64 ranks of processes that do not exist
        for rank in range(32):
            pid = 4_000_000 + 100 * len(job) + rank
            hostile.write(spool, job, layout.state_name(rank, pid),
                          hostile.state(job, rank, pid, world=32, start_ticks=12345))
    collector = make_collector(spool, tmp_path, max_ranks=64, max_ranks_per_job=32,
                               max_ranks_per_uid=64)  # one user here: the liveness rule alone
    scrape(collector)
    assert sorted(_jobs(collector)) == ["aaa-fake", "aab-fake"]
    workers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        proc = RootedFS("/proc")
        for rank, worker in enumerate(workers):
            ticks = procstat.read(proc, worker.pid).start_ticks
            hostile.write(spool, "real-job", layout.state_name(rank, worker.pid),
                          hostile.state("real-job", rank, worker.pid, world=2,
                                        start_ticks=ticks))
        # a fake that names a live process with the wrong start time is not seen alive
        hostile.write(spool, "zzz-fake", layout.state_name(0, workers[0].pid),
                      hostile.state("zzz-fake", 0, workers[0].pid, world=1, start_ticks=1))
        scrape(collector)
        jobs = _jobs(collector)
        assert jobs["real-job"] == [0, 1]
        assert "zzz-fake" not in jobs
        assert sum(len(ranks) for ranks in jobs.values()) == 64
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


def test_one_users_spool_files_never_take_every_place(tmp_path: Path) -> None:
    """Without any process to see (no hostPID), the owner's budget alone keeps room: 64 fake
    ranks of another user take 48 places, and a job of the training user still gets in."""
    spool = tmp_path / "spool"
    for job in ("aaa-fake", "aab-fake"):
        for rank in range(32):
            pid = 4_000_000 + 100 * len(job) + rank
            path = hostile.write(spool, job, layout.state_name(rank, pid),
                                 hostile.state(job, rank, pid, world=32))
            os.chown(path, 65534, 65534)  # nobody's files
    for rank in range(4):  # the training user's (root's here), a process not visible
        hostile.write(spool, "zzz-real", layout.state_name(rank, 5000 + rank),
                      hostile.state("zzz-real", rank, 5000 + rank, world=4))
    collector = make_collector(spool, tmp_path)  # the defaults: 64, 32 a job, 48 a user
    samples = scrape(collector)[0]
    jobs = _jobs(collector)
    assert jobs["zzz-real"] == [0, 1, 2, 3]
    assert sum(len(jobs[j]) for j in ("aaa-fake", "aab-fake") if j in jobs) == 48
    assert series(samples, "llmmon_ranks_spool_rejected_total", reason="too_many_ranks") == {
        (("reason", "too_many_ranks"),): 16}
