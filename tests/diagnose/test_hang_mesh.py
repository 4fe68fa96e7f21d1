"""The tree's hang check on a 2×2 mesh: a rank behind in one group while it waits inside
another group's operation (llmmon_rank_waiting) is not the rank behind, and a group whose ranks
all wait elsewhere is not "stuck before its next collective" (the real parser and check)."""

from __future__ import annotations

from llmmon.diagnose.branches.hang import progress
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.window import LocalView, Observation, parse

# rank 1 never issues its tp all-reduce #6 (group 3 {0,1}): rank 0 waits in it; in dp group 1
# {0,2} rank 2 waits in all_gather #11 for rank 0; dp group 2 {1,3}: rank 3 waits for rank 1;
# tp group 4 {2,3}: nothing in flight.
SEQS = {("3", 0): (6, 5), ("3", 1): (5, 5), ("1", 0): (10, 10), ("1", 2): (11, 10),
        ("2", 1): (10, 10), ("2", 3): (11, 10), ("4", 2): (6, 6), ("4", 3): (6, 6)}
WAITING = {0: 1, 1: 0, 2: 1, 3: 1}


def exposition() -> str:
    job = 'job_id="mesh"'
    lines = ["# TYPE llmmon_nccl_last_enqueued_seq gauge"]
    lines += [f'llmmon_nccl_last_enqueued_seq{{{job},rank="{r}",pg="{pg}"}} {e}'
              for (pg, r), (e, _) in SEQS.items()]
    lines += ["# TYPE llmmon_nccl_last_completed_seq gauge"]
    lines += [f'llmmon_nccl_last_completed_seq{{{job},rank="{r}",pg="{pg}"}} {c}'
              for (pg, r), (_, c) in SEQS.items()]
    for name, value in (("llmmon_nccl_stall_threshold_seconds", 10),
                        ("llmmon_nccl_stalled_seconds", 60), ("llmmon_nccl_quiet_seconds", 60)):
        lines += [f"# TYPE {name} gauge"] + [f'{name}{{{job},pg="{pg}"}} {value}'
                                             for pg in "1234"]
    lines += ["# TYPE llmmon_nccl_last_progress_timestamp_seconds gauge"]
    lines += [f'llmmon_nccl_last_progress_timestamp_seconds{{{job},rank="{r}",pg="{pg}"}} 940'
              for pg, r in SEQS]
    for name, values in (("llmmon_rank_alive", {r: 1 for r in range(4)}),
                         ("llmmon_rank_cpu_idle_seconds", {r: 60 for r in range(4)}),
                         ("llmmon_rank_waiting", WAITING)):
        lines += [f"# TYPE {name} gauge"] + [f'{name}{{{job},rank="{r}"}} {v}'
                                             for r, v in values.items()]
    return "\n".join(lines) + "\n"


def test_only_the_rank_that_waits_on_nothing_is_the_rank_behind() -> None:
    view = LocalView((Observation(1000.0, parse(exposition())),), "scrape", "http://node",
                     Thresholds())
    found = progress(view, Thresholds())
    texts = [e.text for e in found.evidence]
    assert found.verdict == "suspect", texts
    behind = [t for t in texts if "it is the rank behind" in t]
    assert behind and all("rank 1 never enqueued" in t for t in behind), texts
    assert any("group 1: ranks 2 wait in collective #11" in t and "rank 0 waits inside another "
               "group's operation: not the rank behind" in t for t in texts), texts
    assert not any("group 4" in t and "stuck before its next collective" in t
                   for t in texts), texts
