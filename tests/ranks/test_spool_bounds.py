"""The spool is written by other users: what it can cost the daemon is bounded and counted.

Hostile trees from tests/ranks/hostile.py, scaled down from what was seen to break the daemon
(512 junk rank files sorting first, 48 state files of 50k in-flight entries, 40k new group
names per write, a group of 400k rank spans), read by the real collector or `llmmon serve`.
"""

from __future__ import annotations

from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from llmmon.ranks.ledger import MAX_INDEXED_SEQS, NEW_GROUPS_PER_JOB
from llmmon.ranks.validate import MAX_INFLIGHT, MAX_PGS, MAX_SPANS
from llmmon_reporter import layout
from tests.helpers import wait_for
from tests.ranks import hostile
from tests.ranks.jobs import by_rank, make_collector, scrape, series


def test_a_junk_directory_that_sorts_first_never_starves_a_real_job(tmp_path: Path,
                                                                     serve) -> None:
    spool = tmp_path / "spool"
    hostile.real_job(spool)
    hostile.junk_dir(spool, 512)  # written last: the newest files in the spool
    server = serve("--collector.disable-defaults", "--collector.ranks", f"--spool.dir={spool}",
                   "--collector.ranks.interval=0.2s", f"--collector.ranks.fr-dir={tmp_path}/fr")

    def real_job_up() -> dict | None:
        text = requests.get(server.url + "/metrics", timeout=5).text
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        up = by_rank(samples, "llmmon_rank_up", job_id="real-job")
        return samples if up == {0: 1, 1: 1, 2: 1, 3: 1} else None

    samples = wait_for(real_job_up, 60, "the real job's four ranks up")
    rejected = series(samples, "llmmon_ranks_spool_rejected_total")
    assert rejected[(("reason", "too_many"),)] == 1  # the junk directory, once
    assert rejected[(("reason", "invalid_json"),)] == 64  # its 64 newest files were read


def test_one_job_cannot_take_every_rank_slot(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    for rank in range(40):  # valid documents, one job
        hostile.write(spool, "greedy", f"rank_{rank}.{100 + rank}.json",
                      hostile.state("greedy", rank, 100 + rank, world=40))
    hostile.real_job(spool)
    samples, ctx, _ = scrape(make_collector(spool, tmp_path))
    assert by_rank(samples, "llmmon_rank_up", job_id="real-job") == {0: 1, 1: 1, 2: 1, 3: 1}
    assert len(by_rank(samples, "llmmon_rank_up", job_id="greedy")) == 32
    assert series(samples, "llmmon_ranks_spool_rejected_total", reason="too_many_ranks") == {
        (("reason", "too_many_ranks"),): 8}


def test_in_flight_floods_keep_only_the_newest_entries_and_count_the_rest(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    hostile.inflight_flood(spool, files=4, count=MAX_INFLIGHT + 3000)
    # A parse budget no slow machine runs out of: this case is about the in-flight cut alone
    # (the budget has its own cases below).
    collector = make_collector(spool, tmp_path, timeout="1h")
    samples = scrape(collector)[0]
    assert by_rank(samples, "llmmon_rank_up", job_id="flood") == {r: 1 for r in range(4)}
    assert series(samples, "llmmon_nccl_spool_cut_total", reason="inflight_entries") == {
        (("reason", "inflight_entries"),): 4 * 3000}
    # What is kept: enqueue times of the newest entries, no parsed dump (the files still hold
    # theirs: the cached parse and the rank's state do not).
    for track in collector.ledger.tracks.values():
        assert track.state.inflight is None
        assert sum(map(len, track.index.values())) == MAX_INFLIGHT
        assert min(track.index["0"]) == 3000 + 1  # the newest entries' sequence numbers
    assert all(parsed.value is None or parsed.value.inflight is None
               for parsed in collector.ingest._states.values())


def test_a_rank_renaming_its_groups_on_every_write_is_remembered_within_bounds(
        tmp_path: Path) -> None:
    """Each write names MAX_PGS groups never seen before: the job's budget of new names per
    window takes the first NEW_GROUPS_PER_JOB, then the rank follows no group, so Prometheus
    sees a bounded set of series however long the churn goes on."""
    spool = tmp_path / "spool"
    collector = make_collector(spool, tmp_path)
    cut, exported = 0.0, set()
    for rewrite in range(4):
        hostile.group_churn(spool, rewrite, 3000)
        samples = scrape(collector)[0]
        (track,) = collector.ledger.tracks.values()
        names = {f"pg-{rewrite}-{n}" for n in range(MAX_PGS)}
        adopted = names if (rewrite + 1) * MAX_PGS <= NEW_GROUPS_PER_JOB else set()
        assert set(track.state.progress) == adopted
        assert set(track.progress_noted) == adopted
        assert sum(map(len, track.index.values())) <= MAX_INDEXED_SEQS
        assert len(track.collective_bytes) <= 64 and len(track.durations) <= 64
        counted = series(samples, "llmmon_nccl_spool_cut_total")
        assert counted[(("reason", "groups"),)] > cut  # every write's extra groups count
        assert counted[(("reason", "series"),)] > 0
        assert counted.get((("reason", "group_churn"),), 0) == \
            max(0, (rewrite + 1) * MAX_PGS - NEW_GROUPS_PER_JOB)
        cut = counted[(("reason", "groups"),)]
        exported |= set(series(samples, "llmmon_nccl_last_completed_seq"))
    assert len(exported) == NEW_GROUPS_PER_JOB


def test_the_ranks_of_a_job_share_its_group_names_within_the_budget(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    names = [f"g{n}" for n in range(MAX_PGS)]
    for rank in range(32):  # every rank in the same 64 groups: 64 new names, not 32 x 64
        hostile.write(spool, "mesh", layout.state_name(rank, 9000 + rank),
                      hostile.state("mesh", rank, 9000 + rank, world=32, pgs=names))
    collector = make_collector(spool, tmp_path)
    samples = scrape(collector)[0]
    assert all(set(t.state.progress) == set(names) for t in collector.ledger.tracks.values())
    assert (("reason", "group_churn"),) not in series(samples, "llmmon_nccl_spool_cut_total")


def test_a_group_of_400k_rank_spans_gets_a_short_ranks_label(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    hostile.wide_group(spool, 400_000)
    collector = make_collector(spool, tmp_path)
    samples, _, text = scrape(collector)
    (labels,) = series(samples, "llmmon_nccl_pg_info", job_id="wide")
    info = dict(labels)
    assert info["size"] == "800000"
    assert info["ranks"].startswith("0,2,4,") and info["ranks"].endswith(",...")
    assert info["ranks"].count(",") == MAX_SPANS and len(info["ranks"]) < 1024
    assert len(text) < 20_000
    assert series(samples, "llmmon_nccl_spool_cut_total", reason="rank_spans") == {
        (("reason", "rank_spans"),): 1}
    (group,) = collector.evidence()["jobs"][0]["groups"]
    assert group["ranks"] == info["ranks"]


def test_a_spool_too_big_for_one_run_is_read_over_several_each_jobs_newest_first(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    hostile.inflight_flood(spool, files=6, count=MAX_INFLIGHT)  # ~0.5 MB a file
    hostile.real_job(spool)
    collector = make_collector(spool, tmp_path, max_read_bytes=str(1 << 20), timeout="1h")
    samples = scrape(collector)[0]
    assert by_rank(samples, "llmmon_rank_up", job_id="real-job") == {0: 1, 1: 1, 2: 1, 3: 1}
    first = by_rank(samples, "llmmon_rank_up", job_id="flood")
    assert 0 < len(first) < 6
    deferred = series(samples, "llmmon_nccl_spool_cut_total", reason="read_budget")
    assert deferred == {(("reason", "read_budget"),): 6 - len(first)}
    for _ in range(6):
        samples = scrape(collector)[0]
    assert by_rank(samples, "llmmon_rank_up", job_id="flood") == {r: 1 for r in range(6)}


def test_a_run_out_of_parse_time_leaves_the_other_changed_files_for_the_next(
        tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    hostile.inflight_flood(spool, files=3, count=MAX_INFLIGHT)  # each parse takes milliseconds
    collector = make_collector(spool, tmp_path, timeout="1ms")  # half of it: 0.5 ms to parse
    for run in range(1, 4):
        samples = scrape(collector)[0]
        assert len(by_rank(samples, "llmmon_rank_up", job_id="flood")) == run
    assert series(samples, "llmmon_nccl_spool_cut_total", reason="read_budget") == {
        (("reason", "read_budget"),): 2 + 1}
