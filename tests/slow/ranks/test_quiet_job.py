"""A job with nothing in flight whose ranks stopped enqueueing: stalled, and what they do.

No peer waits inside a collective, so no rank is behind: a one-rank job (one GPU, one NCCL
rank) whose data loader never returns, and one frozen with SIGSTOP, its reporter with it.  Both
were silent before (the H200 run of bench/h200/faults_check.py found it); both are now named
at the learned threshold, with the stack or the process state, in the API and the exposition
that LLMTrainingHang{reason="no_rank_enqueues"} reads; `llmmon diagnose --ranks` says that the
silent rank's process is stopped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, group_doc, job_doc, scrape, series, watched_collector

LONG = ["--steps", "100000", "--compute", "0.01", "--hold", "300", "--timeout", "300"]


def test_one_rank_jobs_stuck_before_a_collective_or_frozen_are_stalled(tmp_path: Path) -> None:
    with watched_collector(tmp_path) as (spool, collector):
        stuck_env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="solo")
        frozen_env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="frozen1")
        with Job(tmp_path / "solo", 1, [*LONG, "--culprit", "0", "--stuck-at", "300"],
                 stuck_env), Job(tmp_path / "frozen", 1,
                                 [*LONG, "--culprit", "0", "--freeze-at", "300"],
                                 frozen_env) as frozen:

            def learned(job_id: str):  # type: ignore[no-untyped-def]
                def probe() -> dict | None:
                    group = group_doc(collector, job_id)
                    return group if group and group["pace"]["basis"] == "learned" else None
                return probe
            # The frozen job stops itself at step 300, between collectives (a stop from
            # outside can catch one in flight: "rank 0 waits in all_reduce #49 ...; rank 0 is
            # stopped", as CI once saw).
            wait_for(learned("frozen1"), 480, "the frozen job's pace learned")
            try:
                def stalled(job_id: str):  # type: ignore[no-untyped-def]
                    def probe() -> dict | None:
                        group = group_doc(collector, job_id)
                        return group if group and group["stalled"] else None
                    return probe
                loader = wait_for(stalled("solo"), 600, "the stuck one-rank job to stall")
                verdict = job_doc(collector, "solo")["verdict"]
                stopped = wait_for(stalled("frozen1"), 300, "the frozen one-rank job to stall")
                samples, _, _ = scrape(collector)
                # one read of the spool has no history to time the quiet by; it does see the
                # frozen rank's silence and its process state
                diagnosed = subprocess.run(
                    [sys.executable, "-m", "llmmon", "diagnose", "--ranks", "--spool.dir",
                     str(spool), "--stale-after", "5"], cwd=ROOT, capture_output=True,
                    text=True, timeout=120)
            finally:
                os.kill(frozen.procs[0].pid, signal.SIGCONT)
    print(f"\nstuck: {loader['summary']}\nfrozen: {stopped['summary']}")
    for group in (loader, stopped):
        assert group["op"] is None and group["behind"] == [] and group["quiet_ranks"] == [0]
        assert group["pace"]["basis"] == "learned"
        assert group["stall_threshold_seconds"] <= group["quiet_seconds"] \
            < group["stall_ceiling_seconds"]
        assert re.search(r"every rank here is (stopped or )?stuck before its next collective",
                         group["summary"]), group["summary"]
        quiet = series(samples, "llmmon_nccl_quiet_seconds", job_id=group["job_id"], pg="0")
        assert list(quiet.values())[0] >= group["stall_threshold_seconds"], quiet
    assert "; rank 0 is in load_next_batch (trainer.py:" in loader["summary"], loader["summary"]
    # the job's one verdict says the same: nobody waits, the rank is stuck before its next one
    assert verdict["roots"] == [0] and verdict["waits"] == [], verdict
    assert re.search(r"^job solo: nothing in flight, .*: every rank here is stuck before its "
                     r"next collective; rank 0 \(world group 0 \{0\}\) is in load_next_batch",
                     verdict["summary"]), verdict["summary"]
    assert ", sleeping, no CPU for " in loader["summary"]
    assert loader["doing"]["0"]["where"].startswith("load_next_batch (trainer.py:")
    assert stopped["stopped"] == [0]
    assert "rank 0 is stopped (state T: SIGSTOP or a debugger)" in stopped["summary"]
    assert [dict(k)["state"] for k in series(samples, "llmmon_rank_doing_info",
                                             job_id="frozen1", rank="0")] == ["stopped"]
    assert re.search(r"\[WARN\] ranks: job frozen1, rank 0 \(pid \d+\) stopped reporting \d+ s "
                     r"ago: its process is stopped \(state T: SIGSTOP or a debugger\)",
                     diagnosed.stdout), diagnosed.stdout + diagnosed.stderr
