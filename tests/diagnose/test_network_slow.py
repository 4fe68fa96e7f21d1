"""The network checklist's even-slowdown check over a daemon's own expositions (the view the
daemon's diagnoser keeps of its scrapes): the same condition as LLMTrainingNetworkSlow."""

from __future__ import annotations

from llmmon.diagnose.branches.network import network_slow
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.window import LocalView, Window

PACE = """\
# TYPE llmmon_nccl_collective_gap_seconds gauge
llmmon_nccl_collective_gap_seconds{job_id="netjob",pg="0"} 1.08
llmmon_nccl_collective_gap_seconds{job_id="netjob",pg="1"} 0.2
llmmon_nccl_collective_gap_seconds{job_id="slowjob",pg="0"} 0.6
llmmon_nccl_collective_gap_seconds{job_id="lossyjob",pg="0"} 0.24
# TYPE llmmon_nccl_collective_gap_baseline_seconds gauge
llmmon_nccl_collective_gap_baseline_seconds{job_id="netjob",pg="0"} 0.21
llmmon_nccl_collective_gap_baseline_seconds{job_id="netjob",pg="1"} 0.2
llmmon_nccl_collective_gap_baseline_seconds{job_id="slowjob",pg="0"} 0.2
llmmon_nccl_collective_gap_baseline_seconds{job_id="lossyjob",pg="0"} 0.2
"""


def _tcp(sent: int, lost: dict[str, int]) -> str:
    """TCP counters of each job's namespace after `sent` segments, `lost` retransmitted."""
    lines = ["# TYPE llmmon_tcp_segments_sent_total counter"]
    lines += [f'llmmon_tcp_segments_sent_total{{job_id="{job}",netns="{job}-b"}} {sent}'
              for job in lost]
    lines += ["# TYPE llmmon_tcp_segments_retransmitted_total counter"]
    lines += [f'llmmon_tcp_segments_retransmitted_total{{job_id="{job}",netns="{job}-b"}} {n}'
              for job, n in lost.items()]
    return "\n".join(lines) + "\n"


def _view(*texts: str) -> LocalView:
    window = Window(span=60)
    for at, text in enumerate(texts):
        window.add(text, at=1000.0 + 10 * at)
    return LocalView(window.observations(), "daemon", "http://node-a:9435", Thresholds())


def test_only_the_job_both_slowed_and_lossy_is_suspect() -> None:
    jobs = ("netjob", "slowjob", "lossyjob")
    before = PACE + _tcp(0, dict.fromkeys(jobs, 0))
    after = PACE + _tcp(10_000, {"netjob": 4_000, "slowjob": 5, "lossyjob": 500})
    found = network_slow(_view(before, after), Thresholds())
    assert found.verdict == "suspect", found
    assert [(e.subject, round(e.values["slowdown_ratio"], 2), e.values["retransmitted_share"])
            for e in found.evidence] == [({"job_id": "netjob", "pg": "0"}, 5.14, 0.4)]
    assert found.evidence[0].text == (
        "job netjob runs 5.1x slower than its own pace (group 0) and 40 % of the TCP segments "
        "sent in the network namespace of netjob-b are retransmitted")


def test_a_slow_job_without_loss_and_a_lossy_one_at_its_pace_are_fine() -> None:
    jobs = ("slowjob", "lossyjob")
    pace = "\n".join(line for line in PACE.splitlines() if "netjob" not in line) + "\n"
    found = network_slow(_view(pace + _tcp(0, dict.fromkeys(jobs, 0)),
                               pace + _tcp(10_000, {"slowjob": 5, "lossyjob": 500})),
                         Thresholds())
    assert found.verdict == "ok", found
    assert found.summary == ("no job both slowed and waiting inside its collectives or lossy "
                             "(slowest: job slowjob at 3.0x its own pace; most TCP "
                             "retransmitted: 5 %)")


INSIDE = """\
# TYPE llmmon_nccl_collective_gap_inside_ratio gauge
llmmon_nccl_collective_gap_inside_ratio{job_id="slowjob",pg="0"} 0.9
llmmon_nccl_collective_gap_inside_ratio{job_id="netjob",pg="0"} 0.05
"""


def test_a_slowdown_spent_inside_the_collectives_is_the_network_even_without_loss() -> None:
    # slowjob (3x, 5 segments lost) waits inside its collectives for 90 % of the added time: a
    # slow link; netjob loses 40 % of its TCP segments but spends its added time before the
    # collectives (5 %: a starved input pipeline), so its loss is not what slowed it
    jobs = ("netjob", "slowjob")
    pace = "\n".join(line for line in PACE.splitlines() if "lossyjob" not in line) + "\n"
    found = network_slow(_view(pace + INSIDE + _tcp(0, dict.fromkeys(jobs, 0)),
                               pace + INSIDE + _tcp(10_000, {"netjob": 4_000, "slowjob": 5})),
                         Thresholds())
    assert found.verdict == "suspect", found
    assert [(e.subject, e.values["inside_share"]) for e in found.evidence] == [
        ({"job_id": "slowjob", "pg": "0"}, 0.9)]
    assert found.evidence[0].text == (
        "job slowjob runs 3.0x slower than its own pace (group 0) and on every node at least "
        "90 % of the added time is spent inside the collectives (a slow or congested link)")


def test_one_observation_cannot_say() -> None:
    found = network_slow(_view(PACE + _tcp(0, {"netjob": 0})), Thresholds())
    assert found.verdict == "unknown", found


def test_the_share_is_read_as_the_rule_reads_it_averaged_and_per_node() -> None:
    # slowjob's share flickers (0.9, 0.95, then one read of 0.56 from a handful of status
    # reports): averaged over network_slow_inside_window it is 0.80, as LLMTrainingNetworkSlow
    # reads it; its second group keeps its pace and gives no share, which, as in the rule, does
    # not stand for its node (a node with a pace and no share at all would read as 0)
    pace = ('# TYPE llmmon_nccl_collective_gap_seconds gauge\n'
            'llmmon_nccl_collective_gap_seconds{job_id="slowjob",pg="0"} 0.6\n'
            'llmmon_nccl_collective_gap_seconds{job_id="slowjob",pg="1"} 0.2\n'
            '# TYPE llmmon_nccl_collective_gap_baseline_seconds gauge\n'
            'llmmon_nccl_collective_gap_baseline_seconds{job_id="slowjob",pg="0"} 0.2\n'
            'llmmon_nccl_collective_gap_baseline_seconds{job_id="slowjob",pg="1"} 0.2\n')
    reads = [pace + "# TYPE llmmon_nccl_collective_gap_inside_ratio gauge\n"
             f'llmmon_nccl_collective_gap_inside_ratio{{job_id="slowjob",pg="0"}} {share}\n'
             + _tcp(sent, {"slowjob": 0}) for share, sent in ((0.9, 0), (0.95, 500), (0.56, 900))]
    found = network_slow(_view(*reads), Thresholds())
    assert found.verdict == "suspect", found
    assert [(e.subject, round(e.values["inside_share"], 2)) for e in found.evidence] == [
        ({"job_id": "slowjob", "pg": "0"}, 0.8)]
