"""What the rank behind is doing, at the collector's default settings, in real gloo jobs.

One job, two phases: rank 0 writes a checkpoint (torch.save) while ranks 1 and 2 wait in
all_reduce: busy, not a hang, once it has outlasted the job's learned threshold (the test then
ends it); then rank 2's data loader never returns: stalled once the learned threshold passes,
long before the 180 s ceiling, with its stack, its state and its idle CPU in the verdict.  A
second job: a rank frozen with SIGSTOP, its reporter with it, is named from its process state; a
third stops it inside a collective its peers then enter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, group_doc, reporting, scrape, series, watched_collector

LONG = ["--steps", "100000", "--compute", "0.01", "--hold", "300", "--timeout", "300"]


def test_a_checkpoint_is_busy_and_a_stuck_data_loader_is_hung(tmp_path: Path) -> None:
    # The checkpoint must outlast the threshold learned from the job's pace (5 x its p99 gap
    # between collectives, at most the 180 s ceiling): a fixed 45 s did not, once, under a CPU
    # hog that stretched the gaps to ~9 s.  So it lasts until the test has seen it outlast the
    # threshold (the file `done`), at most 240 s: longer than any threshold can be.
    done = tmp_path / "checkpoint-seen"
    args = [*LONG, "--ckpt-at", "100", "--ckpt-seconds", "240", "--ckpt-until", str(done),
            "--culprit", "2", "--stuck-at", "200"]
    # the collector's defaults: floor 10 s, ceiling 180 s
    with watched_collector(tmp_path) as (spool, collector):
        with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="ckpt")):
            wait_for(reporting(collector, 3), 240, "three ranks making progress")

            seen: list[tuple] = []  # (behind, stalled s, threshold s, basis): why a timeout

            def checkpointing() -> dict | None:
                group = group_doc(collector)
                if group and group["behind"]:
                    look = (group["behind"], round(group["stalled_seconds"]),
                            round(group["stall_threshold_seconds"]), group["pace"]["basis"])
                    if not seen or seen[-1] != look:
                        seen.append(look)
                return group if group and group["behind"] == [0] and \
                    group["stalled_seconds"] > group["stall_threshold_seconds"] else None
            busy = wait_for(checkpointing, 400, "rank 0's checkpoint to outlast the threshold",
                            context=lambda: (seen[:30], seen[-30:], group_doc(collector)))
            done.touch()  # the checkpoint ends: the job goes on to the stuck data loader

            def stuck() -> dict | None:
                group = group_doc(collector)
                return group if group and group["stalled"] else None
            stalled = wait_for(stuck, 600, "the stuck data loader to stall group 0")
            samples, _, _ = scrape(collector)
            diagnosed = subprocess.run(
                [sys.executable, "-m", "llmmon", "diagnose", "--ranks", "--spool.dir",
                 str(spool)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    print(f"\ncheckpoint: {busy['summary']}\nstuck: {stalled['summary']}")
    assert busy["pace"]["basis"] == "learned" and not busy["stalled"] and busy["busy"] == [0]
    assert busy["stall_threshold_seconds"] < 90
    assert "rank 0 never enqueued it" in busy["summary"]
    assert "save_checkpoint (trainer.py:" in busy["summary"] and "not a hang" in busy["summary"]
    assert "writing" in busy["summary"], busy["summary"]

    assert stalled["behind"] == [2] and stalled["waiting"] == [0, 1]
    assert stalled["pace"]["basis"] == "learned"
    assert stalled["stalled_seconds"] < stalled["stall_ceiling_seconds"] == 180
    doing = stalled["doing"]["2"]
    assert doing["where"].startswith("load_next_batch (trainer.py:") and not doing["busy"]
    assert doing["state"] == "sleeping"
    assert "rank 2 never enqueued it (last enqueued #" in stalled["summary"]
    assert ": it is in load_next_batch (trainer.py:" in stalled["summary"]
    assert ", sleeping, no CPU for " in stalled["summary"]
    info = series(samples, "llmmon_rank_doing_info", rank="2")
    assert [dict(k)["where"] for k in info] == [doing["where"]]
    threshold = series(samples, "llmmon_nccl_stall_threshold_seconds", pg="0")
    assert list(threshold.values()) == [stalled["stall_threshold_seconds"]]
    assert diagnosed.returncode == 1, diagnosed.stdout + diagnosed.stderr
    assert "[CRIT] ranks: job ckpt: rank 2 (world group 0 {0-2}" in diagnosed.stdout
    assert diagnosed.stdout.count("[CRIT]") == 1, diagnosed.stdout
    assert ": it is in load_next_batch (trainer.py:" in diagnosed.stdout


def test_a_frozen_rank_is_named_from_its_process_state(tmp_path: Path) -> None:
    with watched_collector(tmp_path) as (spool, collector):
        with Job(tmp_path, 3, LONG, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="frozen")) as job:
            wait_for(reporting(collector, 3, 100), 480, "three ranks making progress")
            os.kill(job.procs[1].pid, signal.SIGSTOP)
            fault = time.time()
            try:
                def frozen() -> dict | None:
                    group = group_doc(collector)
                    return group if group and group["stalled"] and group["stopped"] else None
                group = wait_for(frozen, 120, "the stopped rank to stall its group")
                latency = time.time() - fault
                samples, _, _ = scrape(collector)
            finally:
                os.kill(job.procs[1].pid, signal.SIGCONT)
    print(f"\nSIGSTOP -> verdict: {latency:.2f} s; {group['summary']}")
    assert group["stopped"] == [1]
    # Frozen before its next collective it is the rank behind; frozen inside one, a waiter.
    assert re.search(r"rank 1 (never enqueued it \(last enqueued #\d+\): it )?is stopped "
                     r"\(state T: SIGSTOP or a debugger\), its reporter silent for \d+ s",
                     group["summary"]), group["summary"]
    assert [dict(k)["state"] for k in series(samples, "llmmon_rank_doing_info", rank="1")] == \
        ["stopped"]


def test_a_rank_frozen_inside_a_collective_is_named_stopped_not_the_gpu_or_the_network(
        tmp_path: Path) -> None:
    # Every rank enqueued the all-reduce and none completes it: without the process state that
    # reads as "suspect the GPU or the network"; rank 1 is stopped inside it (its peers enter it
    # only once it is stopped, so it is inside, never before it)
    args = [*LONG, "--culprit", "1", "--freeze-inside-at", "60"]
    with watched_collector(tmp_path) as (spool, collector):
        env = base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="frozen-inside")
        with Job(tmp_path, 3, args, env) as job:
            try:
                def frozen() -> dict | None:
                    group = group_doc(collector)
                    return group if group and group["stalled"] and group["stopped"] else None
                group = wait_for(frozen, 240, "the rank stopped inside a collective to stall it",
                                 context=lambda: (group_doc(collector), job.logs()))
            finally:
                os.kill(job.procs[1].pid, signal.SIGCONT)
    assert (group["stopped"], group["behind"], group["waiting"]) == ([1], [], [0, 1, 2]), group
    assert group["op"]["coll"] == "all_reduce", group
    assert re.search(r"ranks 0–2 wait in all_reduce #\d+ for \d+ s; rank 1 is stopped \(state "
                     r"T: SIGSTOP or a debugger\), its reporter silent for \d+ s",
                     group["summary"]), group["summary"]
    assert "suspect the GPU or the network" not in group["summary"], group["summary"]


def test_a_rank_behind_on_another_node_is_left_to_its_own_nodes_daemon(tmp_path: Path) -> None:
    # Rank 1 runs no reporter (a rank of another node) and its data loader never returns: ranks
    # 0 and 2 wait for it.  This node cannot see whether it is hung or writing a checkpoint, so
    # it calls the group stalled only at the ceiling, not at the learned threshold.
    args = [*LONG, "--culprit", "1", "--culprit-unwatched", "--stuck-at", "150"]
    with watched_collector(tmp_path, stall_after="40s") as (spool, collector):
        with Job(tmp_path, 3, args, base_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="remote")):
            wait_for(reporting(collector, 2), 240, "two ranks making progress")

            def waiting(beyond: str) -> Callable[[], dict | None]:
                def probe() -> dict | None:
                    group = group_doc(collector)
                    return group if group and group["op"] and \
                        group["stalled_seconds"] > group[beyond] + 2 else None
                return probe
            early = wait_for(waiting("stall_threshold_seconds"), 400, "a stall past the threshold")
            late = wait_for(waiting("stall_ceiling_seconds"), 400, "a stall past the ceiling")
    assert early["pace"]["basis"] == "learned" and early["stall_threshold_seconds"] < 40
    assert early["remote"] and not early["stalled"], early
    # both wait for rank 1 (one of them may still show the previous collective in flight: its
    # last report came before that completed), and no rank of this node is behind
    assert set(early["waiting"]) <= {0, 2} and early["waiting"] and early["behind"] == [], early
    assert "the rank behind is on another node" in early["summary"]
    assert "its own node's daemon judges it" in early["summary"], early["summary"]
    assert late["stalled"], late
