"""The tree's hang check on a job with nothing in flight whose ranks enqueue nothing: the quiet
case of LLMTrainingHang{reason="no_rank_enqueues"}, read from an exposition as the daemon writes
it (the real parser and the real check)."""

from __future__ import annotations

from llmmon.diagnose.branches.hang import progress
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.window import Observation, LocalView, parse


def exposition(quiet: float, cpu_idle: float) -> str:
    job = 'job_id="solo"'
    return f"""# TYPE llmmon_nccl_last_enqueued_seq gauge
llmmon_nccl_last_enqueued_seq{{{job},rank="0",pg="0"}} 600
# TYPE llmmon_nccl_last_completed_seq gauge
llmmon_nccl_last_completed_seq{{{job},rank="0",pg="0"}} 600
# TYPE llmmon_nccl_stall_threshold_seconds gauge
llmmon_nccl_stall_threshold_seconds{{{job},pg="0"}} 10
# TYPE llmmon_nccl_stalled_seconds gauge
llmmon_nccl_stalled_seconds{{{job},pg="0"}} 0
# TYPE llmmon_nccl_quiet_seconds gauge
llmmon_nccl_quiet_seconds{{{job},pg="0"}} {quiet}
# TYPE llmmon_rank_alive gauge
llmmon_rank_alive{{{job},rank="0"}} 1
# TYPE llmmon_rank_cpu_idle_seconds gauge
llmmon_rank_cpu_idle_seconds{{{job},rank="0"}} {cpu_idle}
# TYPE llmmon_rank_doing_info gauge
llmmon_rank_doing_info{{{job},rank="0",state="sleeping",where="load_next_batch (data.py:41)"}} 1
"""


def judged(quiet: float, cpu_idle: float):  # type: ignore[no-untyped-def]
    view = LocalView((Observation(1000.0, parse(exposition(quiet, cpu_idle))),), "scrape",
                     "http://node", Thresholds())
    return progress(view, Thresholds())


def test_a_quiet_job_past_its_threshold_is_hung_with_each_rank_named() -> None:
    found = judged(quiet=35, cpu_idle=35)
    texts = [e.text for e in found.evidence]
    assert found.verdict == "suspect", texts
    assert texts[0] == ("job solo, group 0: nothing in flight and no rank enqueued a collective "
                        "for 35 s (window 10 s): every rank is stuck before its next collective")
    assert "rank 0" in texts[1] and "enqueued nothing since #600: it is in load_next_batch " \
        "(data.py:41), sleeping, no CPU for 35 s" in texts[1], texts


def test_quiet_within_the_threshold_or_while_a_rank_works_is_not_a_hang() -> None:
    assert judged(quiet=8, cpu_idle=8).verdict == "ok"
    working = judged(quiet=300, cpu_idle=1)
    assert working.verdict == "ok"
    assert any("works (CPU or I/O): an evaluation or a checkpoint, not a hang" in e.text
               for e in working.evidence), [e.text for e in working.evidence]
