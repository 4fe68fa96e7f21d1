"""Whatever is wrong with the spool, the training loop runs exactly as it does without us.

Each case trains the same seeded job with the reporter on and compares the trained weights with
a run without the reporter; the reporter must count its failures, back off and finally disable
itself.  The read-only and full cases mount real tmpfs file systems (the tests run as root).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, by_rank, make_collector, scrape, series

JOB = "failing-spool"
FAST_FAILURES = {"LLMMON_STATUS_INTERVAL": "0.02",  # backoff is capped at 30 intervals
                 "LLMMON_JOB": JOB}


def train(tmp: Path, spool: Path, reporter: str = "explicit", wait_disabled: int = 0) -> dict:
    args = ["--steps", "30", "--reporter", reporter, "--wait-disabled", str(wait_disabled)]
    with Job(tmp, 1, args, base_env(LLMMON_SPOOL=str(spool), **FAST_FAILURES)) as job:
        job.wait(120)
        return job.result(0)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("baseline")
    return train(tmp, tmp / "unused", reporter="off")


@pytest.fixture
def mounts() -> Iterator[Callable[[Path, str], Path]]:
    """mount -t tmpfs -o OPTIONS on a directory; unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, options: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True,
                       capture_output=True, timeout=10)
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=10)


def missing(tmp: Path, mount: Callable) -> Path:
    return tmp / "no" / "such" / "spool"


def not_a_directory(tmp: Path, mount: Callable) -> Path:
    (tmp / "spool").write_text("a file where the spool should be")
    return tmp / "spool"


def read_only(tmp: Path, mount: Callable) -> Path:
    return mount(tmp / "spool", "ro,size=64k")


def full(tmp: Path, mount: Callable) -> Path:
    # two pages: the entries soon outgrow them; on disabling, the reporter deletes its entries
    # file, so the small state file saying why always fits
    return mount(tmp / "spool", "size=8k")


def taken_by_another_user(tmp: Path, mount: Callable) -> Path:
    """Another user made the job directory first, writable by all, and planted FIFOs in it."""
    job = tmp / "spool" / JOB
    job.mkdir(parents=True)
    for name in ("rank_0.json", ".rank_0.json.tmp", "rank_0.entries.jsonl"):
        os.mkfifo(job / name)
    os.chown(job, 4242, 4242)
    job.chmod(0o777)
    return tmp / "spool"


@pytest.mark.parametrize("make_spool, cause", [
    (missing, "does not exist"),
    (not_a_directory, "does not exist"),
    (read_only, "Read-only file system"),
    (full, "No space left on device"),
    (taken_by_another_user, "belongs to uid 4242, not to this rank's uid"),
])
def test_a_broken_spool_never_changes_training(tmp_path: Path, baseline: dict, mounts,
                                               make_spool: Callable, cause: str) -> None:
    spool = make_spool(tmp_path, mounts)
    result = train(tmp_path, spool, wait_disabled=30)

    assert result["checksum"] == baseline["checksum"]
    health = result["health"]
    assert health["errors_total"] >= 10 and cause in health["last_error"]
    assert health["disabled"] and not health["running"]
    assert cause in health["disabled_reason"]
    if make_spool is full:  # it said so in its file, which the daemon reads
        samples = scrape(make_collector(spool, tmp_path))[0]
        assert by_rank(samples, "llmmon_reporter_disabled") == {0: 1}
        assert by_rank(samples, "llmmon_reporter_errors_total")[0] >= 9


def test_without_a_daemon_the_reporter_just_writes_and_cleans_up_at_exit(
        tmp_path: Path, baseline: dict) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    result = train(tmp_path, spool)
    assert result["checksum"] == baseline["checksum"]
    assert result["health"]["errors_total"] == 0 and result["health"]["running"]
    # after a clean exit only the small state file is left (the daemon drops it later)
    assert [p.name for p in spool.rglob("rank_*")] == [f"rank_0.{result['pid']}.json"]


def test_fifos_planted_at_the_temporary_file_names_never_block_the_reporter(
        tmp_path: Path) -> None:
    """FIFOs at the names a reporter used to write through (`.<name>.tmp`) and at the final
    names: the reporter opens none of them and goes on writing."""
    spool = tmp_path / "spool"
    spool.mkdir()
    env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB=JOB)
    with Job(tmp_path, 1, ["--steps", "10", "--hold", "60"], env) as job:
        state = wait_for(lambda: next((spool / JOB).glob("rank_0.*[0-9].json"), None), 60,
                         "the first state file")
        entries = state.with_name(state.name.replace(".json", ".entries.jsonl"))
        for name in (state.name, entries.name):
            os.mkfifo(state.parent / f".{name}.tmp")
        entries.unlink(missing_ok=True)
        os.mkfifo(entries)  # the next entries write renames over it
        ticks = json.loads(state.read_text())["reporter"]["ticks"]

        def later() -> int | None:
            try:
                now = json.loads(state.read_text())["reporter"]["ticks"]
            except ValueError:
                return None
            return now if now >= ticks + 20 else None

        wait_for(later, 60, f"20 more reporter ticks after {ticks}")
        wait_for(lambda: entries.is_file(), 60, "the entries file written over the FIFO")
        health = job.result(0)["health"]
        samples = scrape(make_collector(spool, tmp_path))[0]
    assert health["running"] and health["errors_total"] == 0, health
    assert by_rank(samples, "llmmon_rank_up") == {0: 1}
    assert not series(samples, "llmmon_ranks_spool_rejected_total")  # the FIFOs are temporaries
