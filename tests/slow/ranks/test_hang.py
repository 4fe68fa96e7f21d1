"""A real hang: rank 2 stops issuing collectives, ranks 0 and 1 block in the next all_reduce.

The collector, /api/v1/ranks of a running daemon and `llmmon diagnose --ranks` must all name
rank 2 as the one behind, and the daemon must fetch a Flight Recorder dump through the pipes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

from llmmon.commands.launch import environment
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.ranks.jobs import Job, base_env, by_rank, looks, make_collector, scrape, series

JOB = "llama-hang"
STEPS = 20  # rank 2 stops at step 10, after 2 x 10 all_reduces in group 0


def _state(spool: Path, rank: int) -> dict:
    """Rank `rank`'s state file, read whole (a read between write and rename retries)."""
    def read() -> dict | None:
        try:
            return json.loads(next((spool / JOB).glob(f"rank_{rank}.*[0-9].json")).read_text())
        except (ValueError, StopIteration):
            return None
    return wait_for(read, 30, f"rank {rank}'s state file")


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmmon", "diagnose", "--ranks", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_the_rank_that_stopped_issuing_collectives_is_named_everywhere(
        tmp_path: Path, serve) -> None:
    spool, fr_dir, pipe_dir = tmp_path / "spool", tmp_path / "fr", tmp_path / "pipe"
    spool.mkdir()
    env = environment(base_env(), JOB, str(spool), str(fr_dir), str(pipe_dir), 2000,
                      timing=False, dump_on_timeout=True)
    env["PYTHONPATH"] = base_env()["PYTHONPATH"]
    for directory in (fr_dir / JOB, pipe_dir / JOB):
        directory.mkdir(parents=True)
    collector = make_collector(spool, tmp_path, stall_after="1s", auto_dump="false")
    args = ["--steps", str(STEPS), "--compute", "0.01", "--behaviour", "hang", "--culprit", "2",
            "--hold", "600", "--timeout", "600"]  # the hang outlasts a slow run of this test
    with Job(tmp_path, 3, args, env) as job:
        def stalled() -> dict | None:
            evidence = collector.evidence()
            scrape(collector)
            # On a loaded machine ranks can sit in one slow collective past the 1 s stall
            # window for a moment, even with one of them behind (rank 0 in the pair's
            # all_gather before rank 1 enqueued it); the hang is the stall that stays, and it
            # stays alone: every other group moves on or has nobody behind.
            groups = [g for j in evidence["jobs"] for g in j["groups"]
                      if g["stalled"] and g["behind"]]
            return groups[0] if [g["pg"] for g in groups] == ["0"] else None

        group = wait_for(stalled, 300, "group 0 to stall",  # three torch imports under load
                         context=lambda: looks(collector, job))
        samples = scrape(collector)[0]

        def inflight() -> list | None:
            try:
                doc = json.loads(next((spool / JOB).glob("rank_0.*[0-9].json")).read_text())
            except ValueError:
                return None  # read between write and rename: next time
            return doc["inflight"] and doc["inflight"]["entries"]

        # gloo's dump returns the whole ring as active; the reporter ships what is in flight
        waiting_in = wait_for(inflight, 60, "rank 0's in-flight records")
        server = serve("--collector.disable-defaults", "--collector.ranks",
                       f"--spool.dir={spool}", "--collector.ranks.interval=0.2s",
                       "--collector.ranks.stall-after=1s", "--collector.ranks.dump-after=1s",
                       f"--collector.ranks.fr-dir={fr_dir}",
                       f"--collector.ranks.pipe-dir={pipe_dir}")

        def daemon_sees_stall() -> dict | None:
            doc = requests.get(server.url + "/api/v1/ranks", timeout=5).json()
            return doc if doc["jobs"] and doc["jobs"][0]["stalled_groups"] else None

        api = wait_for(daemon_sees_stall, 120, "the daemon to see the stall")
        written_before = _state(spool, 2)["activity"]["written_bytes"]
        # The daemon asked every rank for a dump through its pipe and kept the set: the whole
        # set, which can settle across two dump-<second> directories when the ranks write
        # their dumps a moment apart.
        def whole_set() -> dict[str, Path] | None:
            kept = {p.name: p for p in fr_dir.glob(f"{JOB}/dump-*/rank_*.json")}
            return kept if len(kept) == 3 else None

        kept = wait_for(whole_set, 90, "every rank's dump to be kept")
        # the rank's next state after its dump: the reporter's own writes are not its I/O
        dumps = _state(spool, 2)["reporter"]["ticks"]
        wait_for(lambda: _state(spool, 2)["reporter"]["ticks"] > dumps + 1, 60, "two more ticks")
        written_after = _state(spool, 2)["activity"]["written_bytes"]
        text = diagnose("--url", server.url)
        from_spool = diagnose("--spool.dir", str(spool), "--stall-after", "1", "--json",
                              "--dump", "--pipe-dir", str(pipe_dir))
        assert job.result(2)["health"]["errors_total"] == 0

    assert group["pg"] == "0" and group["behind"] == [2] and group["waiting"] == [0, 1]
    dump_size = kept["rank_2.json"].stat().st_size
    assert written_after - written_before < dump_size / 2, (written_before, written_after,
                                                            dump_size)
    assert [(e["process_group"][0], e["collective_seq_id"], e["retired"]) for e in waiting_in] \
        == [("0", 21, False)]
    assert group["op"]["seq"] == 2 * STEPS // 2 + 1 and group["op"]["coll"] == "all_reduce"
    assert by_rank(samples, "llmmon_nccl_last_enqueued_seq", pg="0") == {0: 21, 1: 21, 2: 20}
    assert by_rank(samples, "llmmon_nccl_last_completed_seq", pg="0") == {0: 20, 1: 20, 2: 20}
    progress = by_rank(samples, "llmmon_nccl_last_progress_timestamp_seconds", pg="0")
    assert series(samples, "llmmon_nccl_group_last_progress_timestamp_seconds", pg="0") == \
        {(("job_id", JOB), ("pg", "0")): max(progress.values())}
    ages = by_rank(samples, "llmmon_nccl_oldest_inflight_age_seconds", pg="0")
    assert ages[0] > 0 and ages[1] > 0 and ages[2] == 0

    stalled_api = [g for g in api["jobs"][0]["groups"] if g["stalled"]][0]
    assert api["jobs"][0]["job_id"] == JOB and stalled_api["behind"] == [2]
    assert stalled_api["summary"].startswith(
        f"job {JOB}, group 0 (default_pg): ranks 0–1 wait in all_reduce #21 for ")
    assert "rank 2 never enqueued it (last enqueued #20)" in stalled_api["summary"]
    assert sorted(kept) == ["rank_0.json", "rank_1.json", "rank_2.json"]
    dump = json.loads(kept["rank_2.json"].read_text())
    assert dump["pg_status"]["0"]["last_enqueued_collective"] == "20"

    assert text.returncode == 1, text.stderr
    # one [CRIT] for the job: its root, then who waits for it; the group's sentence as evidence
    assert "[CRIT] ranks: job llama-hang: rank 2 (world group 0 {0-2}) is in " \
        in text.stdout, text.stdout
    assert "ranks 0–1 wait in world all_reduce #21 (group 0) for rank 2" in text.stdout
    assert "rank 2 never enqueued it (last enqueued #20)" in text.stdout
    assert text.stdout.count("[CRIT]") == 1, text.stdout
    findings = json.loads(from_spool.stdout)
    critical = [f for f in findings if f["severity"] == "critical"]
    assert [f["evidence"]["roots"] for f in critical] == [[2]]
    requested = [f for f in findings if "dump" in f["evidence"]]
    assert requested[0]["evidence"]["dump"] == {"0": "requested", "1": "requested",
                                                "2": "requested"}
