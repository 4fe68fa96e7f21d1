"""Once per incident, judged on the real 4-rank NCCL capture as the ranks collector sees it
(rank 3 never enqueues, its peers wait): a stall that goes on is one incident, a job that
leaves and stalls again is another, and a directory the daemon cannot write costs a clear
error and a count, not the daemon."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llmmon.incidents import capture, layout
from llmmon.incidents.capture import CounterRing
from llmmon.incidents.recorder import Limits, Recorder, Sources
from llmmon.ranks import stall
from llmmon.sources.fs import RootedFS
from tests.ranks.jobs import make_collector, scrape
from tests.ranks.test_nccl_dumps import staged

LIMITS = Limits(max_bytes=16 << 20, max_total_bytes=64 << 20, keep=8)


def _stalled(tmp_path: Path) -> tuple[stall.Evidence, float]:
    spool, written = staged(tmp_path, "nccl4")
    ranks = make_collector(spool, tmp_path, stale_after="1h")
    scrape(ranks, written)
    scrape(ranks, written + 90)
    evidence = ranks.latest()
    assert [job.verdict.stalled for job in evidence.jobs] == [True]
    return evidence, written + 90


def _recorder(root: Path, tmp_path: Path, now: float) -> Recorder:
    sources = Sources(RootedFS("/proc"), str(tmp_path / "fr"), str(tmp_path / "pipe"),
                      str(tmp_path / "no-kmsg"), "node-a")
    return Recorder(str(root), LIMITS, sources, CounterRing(), clock=lambda: now)


def _kept(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if layout.ID.match(p.name))


def test_a_stall_that_goes_on_is_one_incident_and_a_new_stall_another(tmp_path: Path) -> None:
    evidence, now = _stalled(tmp_path)
    root = tmp_path / "incidents"
    recorder = _recorder(root, tmp_path, now)
    assert recorder.observe(evidence) == ["llama-8b"]
    assert recorder.observe(evidence) == []  # still the same stall
    assert recorder.wait(30)
    [first] = _kept(root)
    assert recorder.observe(evidence) == []  # written, and still stalled
    left = stall.Evidence(now, evidence.limits, ())
    assert recorder.observe(left) == []  # the job left the node: its incident closes
    assert recorder.observe(evidence) == ["llama-8b"]  # stalled again: a new incident
    assert recorder.wait(30)
    assert len(_kept(root)) == 2 and first in _kept(root)
    assert recorder.snapshot().by_trigger["stalled"] == 2
    summary = json.loads((root / first / layout.SUMMARY).read_text())
    # no kernel log here: said, and the rest is kept
    assert summary["errors"] == [f"kernel log: {tmp_path / 'no-kmsg'}: No such file or directory"]
    assert summary["dumps"] == {str(r): "no pipe" for r in range(4)}
    assert summary["culprit"]["ranks"] == [3] and summary["local_ranks"] == [0, 1, 2, 3]


def test_a_directory_the_daemon_cannot_write_is_a_clear_error_and_a_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    evidence, now = _stalled(tmp_path)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    recorder = _recorder(blocked, tmp_path, now)
    with caplog.at_level(logging.ERROR, logger="llmmon.incidents"):
        assert recorder.observe(evidence) == ["llama-8b"]
        assert recorder.wait(30)
    assert recorder.snapshot().failed == 1 and recorder.snapshot().by_trigger["stalled"] == 0
    [record] = caplog.records
    assert record.exc_info is None  # one line, no traceback
    assert f"could not be written under {blocked} (--collector.incidents.dir)" in \
        record.getMessage()


def test_a_job_that_only_waited_for_another_node_and_completes_again_withdraws_it(
        tmp_path: Path) -> None:
    """Ranks 0-2 here wait for rank 3, on another node, past the learned threshold: the
    incident is kept while they wait; once the job completes again, that rank was busy (a
    checkpoint), and the incident goes."""
    spool, written = staged(tmp_path, "nccl4")
    for path in (spool / "llama-8b").glob("rank_3.*"):
        path.unlink()  # rank 3 is another node's
    ranks = make_collector(spool, tmp_path, stale_after="1h")
    scrape(ranks, written)
    calm = ranks.latest()  # the job here, nothing waiting yet
    scrape(ranks, written + 90)
    waiting = ranks.latest()
    assert [capture.trigger(job) for job in (*calm.jobs, *waiting.jobs)] == [None, "waiting"]
    root = tmp_path / "incidents"
    recorder = _recorder(root, tmp_path, written + 90)
    assert recorder.observe(waiting) == ["llama-8b"]
    assert recorder.wait(30)
    [kept] = _kept(root)
    summary = json.loads((root / kept / layout.SUMMARY).read_text())
    assert (summary["trigger"], summary["culprit"]["cause"]) == ("waiting", "remote")
    assert recorder.observe(waiting) == [] and _kept(root) == [kept]  # still waiting: kept
    assert recorder.observe(calm) == []  # it completes again
    assert _kept(root) == [] and recorder.snapshot().withdrawn == 1
    assert recorder.snapshot().newest == {}
