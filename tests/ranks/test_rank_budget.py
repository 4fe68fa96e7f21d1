"""The rank budget against spool files any local user can write: fake ranks that came first do
not keep a real job out once its processes are seen alive."""

from __future__ import annotations

import subprocess
from pathlib import Path

from llmmon.sources import procstat
from llmmon.sources.fs import RootedFS
from llmmon_reporter import layout
from tests.ranks import hostile
from tests.ranks.jobs import make_collector, scrape


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
    collector = make_collector(spool, tmp_path, max_ranks=64, max_ranks_per_job=32)
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
