"""A job's end is never a hang: clean exit, a crash torn down by torchrun, a SIGKILL, preemption.

Real gloo jobs; the collector (with its procfs watcher) follows them while they run and must
say "job ended" or "rank N exited first (...) and took the job down" afterwards, export
llmmon_rank_alive 0 (the rules' evidence) and never call a group stalled.  Printed figures are
the time from the fault to the verdict (run with -s to see them); they are not asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from llmmon.collectors.ranks import RanksCollector
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import (TRAINER, Job, base_env, by_rank, job_doc, make_collector, reporting,
                              scrape, watched_collector)

LONG = ["--steps", "100000", "--compute", "0.01", "--hold", "300", "--timeout", "300"]


def ended(collector, job_id: str | None = None):  # type: ignore[no-untyped-def]
    def probe() -> dict | None:
        job = job_doc(collector, job_id)
        return job if job and job["end"] and job["end"]["ended"] else None
    return probe


def assert_not_hung(job: dict) -> None:
    assert job["stalled_groups"] == []
    assert all(g["summary"].startswith(f"job {job['job_id']}, group {g['pg']}")
               and ": not a hang: " in g["summary"] for g in job["groups"]), job["groups"]


def test_a_job_that_finished_reads_as_ended(tmp_path: Path) -> None:
    with watched_collector(tmp_path) as (spool, collector):
        with Job(tmp_path, 2, ["--steps", "40", "--compute", "0.01"],
                 base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="done")) as job:
            wait_for(reporting(collector, 2, 10), 240, "both ranks to report")
            job.wait(240)
            doc = wait_for(ended(collector), 30, "the job's end")
        samples = scrape(collector)[0]
        diagnosed = subprocess.run([sys.executable, "-m", "llmmon", "diagnose", "--ranks",
                                    "--spool.dir", str(spool)], cwd=ROOT, capture_output=True,
                                   text=True, timeout=120)
    assert doc["end"]["summary"] == "job done ended: every rank on this node exited normally"
    assert [(e["rank"], e["how"], e["code"]) for e in doc["end"]["ranks"]] == [
        (0, "exit", 0), (1, "exit", 0)]
    assert_not_hung(doc)
    assert by_rank(samples, "llmmon_rank_alive") == {0: 0, 1: 0}
    assert by_rank(samples, "llmmon_rank_exit_code") == {0: 0, 1: 0}
    assert diagnosed.returncode == 0, diagnosed.stdout + diagnosed.stderr
    assert "not a hang: job done ended" in diagnosed.stdout and "CRIT" not in diagnosed.stdout


@contextmanager
def _torchrun(tmp_path: Path, job_id: str, args: list[str], **overrides: str
              ) -> Iterator[tuple[RanksCollector, subprocess.Popen[bytes], dict]]:
    """Three ranks under torchrun (which tears the others down when one dies), a collector
    on their spool, and the job's document once its watcher has seen every rank alive."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    out.mkdir()
    collector = make_collector(spool, tmp_path, **overrides)
    collector.start()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "3", str(TRAINER), "--out", str(out), *args, *LONG]
    log = open(tmp_path / "torchrun.log", "wb")
    torchrun = subprocess.Popen(command, env=base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB=job_id),
                                cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The watcher must have seen the ranks alive before they die; poll until it has.
        def running() -> dict | None:
            job = job_doc(collector)
            return job if job and len(job["ranks"]) == 3 and all(
                (process := collector.watch.get((job_id, r["rank"], r["pid"])))
                and process.visible for r in job["ranks"]) else None
        yield collector, torchrun, wait_for(running, 240, "three ranks seen alive")
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait(30)
        log.close()
        collector.close()


def test_torchrun_tears_the_job_down_after_a_crash_and_the_crashed_rank_is_named(
        tmp_path: Path) -> None:
    with _torchrun(tmp_path, "crash", ["--culprit", "1", "--crash-at", "150"]) as (
            collector, torchrun, _):
        doc = wait_for(ended(collector), 120, "the job's end")
        verdict_at = time.time()
        assert torchrun.wait(60) != 0
    crashed = next(e for e in doc["end"]["ranks"] if e["rank"] == 1)
    print(f"\ncrash -> verdict: {verdict_at - crashed['latest']:.2f} s; {doc['end']['summary']}")
    assert doc["end"]["first"] == [1], (doc["end"], (tmp_path / "torchrun.log").read_text()[-3000:])
    assert doc["end"]["summary"].startswith(
        "job crash: rank 1 exited first (code 1: RuntimeError: rank 1 crashed at step 150) and "
        "took the job down; rank(s) 0, 2 ended after it")
    assert_not_hung(doc)


def _killed_job(tmp_path: Path, job_id: str, kill) -> tuple[dict, float, dict]:  # type: ignore[no-untyped-def]
    with watched_collector(tmp_path) as (spool, collector):
        with Job(tmp_path, 3, LONG, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB=job_id)) as job:
            wait_for(reporting(collector, 3), 240, "three ranks making progress")
            wait_for(lambda: all(collector.watch.get((job_id, r, p.pid)) and
                                 collector.watch.get((job_id, r, p.pid)).visible
                                 for r, p in enumerate(job.procs)), 30, "ranks seen alive")
            fault = time.time()
            kill(job.procs)
            doc = wait_for(ended(collector), 120, "the job's end")
            latency = time.time() - fault
            samples = scrape(collector)[0]
    return doc, latency, samples


def test_a_killed_rank_is_named_first_not_the_peers_it_took_down(tmp_path: Path) -> None:
    doc, latency, samples = _killed_job(tmp_path, "killed", lambda procs: procs[2].kill())
    print(f"\nSIGKILL -> verdict: {latency:.2f} s; {doc['end']['summary']}")
    assert doc["end"]["first"] == [2], doc["end"]
    assert doc["end"]["summary"].startswith(
        "job killed: rank 2 exited first (killed by signal 9) and took the job down"), doc["end"]
    assert_not_hung(doc)
    assert by_rank(samples, "llmmon_rank_alive") == {0: 0, 1: 0, 2: 0}
    assert by_rank(samples, "llmmon_rank_exit_code")[2] == -9


def test_preemption_stops_every_rank_at_once_and_no_rank_is_blamed(tmp_path: Path) -> None:
    def preempt(procs: list) -> None:  # type: ignore[type-arg]
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
    doc, latency, _ = _killed_job(tmp_path, "preempted", preempt)
    print(f"\nSIGTERM to all -> verdict: {latency:.2f} s; {doc['end']['summary']}")
    assert doc["end"]["first"] == [], doc["end"]
    assert doc["end"]["summary"].startswith("job preempted ended: ranks 0–2 stopped within ")
    assert "without an exit record (a signal from outside" in doc["end"]["summary"]
    assert_not_hung(doc)


def _crashed_job(tmp_path: Path, job_id: str, culprit_args: list[str]) -> dict:
    """Three ranks, the culprit (rank 1) ends at step 60 as `culprit_args` say; no torchrun, so
    its peers end on their own (a gloo error in their next collective), not by a teardown."""
    with watched_collector(tmp_path) as (spool, collector):
        args = [*LONG, "--culprit", "1", *culprit_args]
        with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB=job_id)) as job:
            wait_for(ended(collector), 240, "the job's end")
            doc = job_doc(collector)
            assert doc is not None
            diagnosed = subprocess.run(
                [sys.executable, "-m", "llmmon", "diagnose", "--ranks", "--spool.dir",
                 str(spool)], cwd=ROOT, capture_output=True, text=True, timeout=120)
            return doc | {"logs": job.logs(), "diagnose": diagnosed.stdout + diagnosed.stderr}


def test_a_rank_that_calls_sys_exit_is_named_first_with_the_status_it_asked_for(
        tmp_path: Path) -> None:
    doc = _crashed_job(tmp_path, "quit", ["--exit-at", "60"])
    assert doc["end"]["first"] == [1], (doc["end"], doc["logs"][-3000:])
    assert doc["end"]["summary"].startswith(
        "job quit: rank 1 exited first (code 3) and took the job down"), doc["end"]
    assert [(e["rank"], e["how"], e["code"]) for e in doc["end"]["ranks"]][1] == (1, "exit", 3)
    assert_not_hung(doc)
    # diagnose says it too, as a warning, in place of "rank N stopped reporting"
    assert "[WARN] ranks: job quit: rank 1 exited first (code 3)" in doc["diagnose"], doc
    assert "stopped reporting" not in doc["diagnose"], doc["diagnose"]


def test_peers_of_a_rank_this_daemon_does_not_follow_blame_nobody_here(tmp_path: Path) -> None:
    # Rank 1 runs no reporter, as a rank of another node: ranks 0 and 2 fail in their next
    # collective with gloo's "connection closed by peer"; neither is the first to fail.
    doc = _crashed_job(tmp_path, "remote", ["--crash-at", "60", "--culprit-unwatched"])
    assert [r["rank"] for r in doc["ranks"]] == [0, 2], doc["ranks"]
    assert [(e["rank"], e["how"]) for e in doc["end"]["ranks"]] == [
        (0, "exception"), (2, "exception")], (doc["end"], doc["logs"][-3000:])
    assert doc["end"]["first"] == [], doc["end"]
    assert doc["end"]["summary"].startswith("job remote: rank(s) 0, 2 lost a peer ("), doc["end"]
    assert "the rank that failed first is not on this node" in doc["end"]["summary"]
    assert_not_hung(doc)
    assert "[info] ranks: job remote: rank(s) 0, 2 lost a peer" in doc["diagnose"], doc
    assert "WARN" not in doc["diagnose"] and "CRIT" not in doc["diagnose"], doc["diagnose"]


def test_a_killed_rank_is_seen_through_its_pidfd_before_anyone_reaps_it(tmp_path: Path) -> None:
    # torchrun reaps a dead worker within its 0.1 s monitor interval: the SIGKILL status lives
    # that long, and a poll every 0.1 s missed it about half the time.  Here the watcher's poll
    # is a minute apart and nobody reaps the killed rank until the watcher has seen it gone, so
    # only its pidfd, which wakes it the moment the process exits, can have read the status.
    with watched_collector(tmp_path, pid_poll="1m") as (spool, collector):
        with Job(tmp_path, 3, LONG, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="pidfd")) as job:
            wait_for(reporting(collector, 3), 240, "three ranks making progress")
            key = ("pidfd", 1, job.procs[1].pid)
            wait_for(lambda: (p := collector.watch.get(key)) and p.visible, 30, "rank 1 seen")
            job.procs[1].kill()
            seen = wait_for(lambda: (p := collector.watch.get(key)) and p.gone_at and p, 30,
                            "the watcher to see rank 1 gone (well before its 1-minute poll)")
            job.procs[1].wait(30)
            doc = wait_for(ended(collector), 120, "the job's end")
    assert seen.exit_status == -9, seen
    assert doc["end"]["first"] == [1], doc["end"]
    assert doc["end"]["summary"].startswith(
        "job pidfd: rank 1 exited first (killed by signal 9) and took the job down"), doc["end"]
    assert_not_hung(doc)
