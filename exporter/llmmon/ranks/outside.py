"""The ranks that run without the reporter, each collector run: found, sampled, judged.

`llmmon.ranks.discover` finds them and writes their state as the reporter would,
`llmmon.ranks.stacksampler` takes their stacks, `llmmon.ranks.stacks` judges each job from
them.  The collector feeds the states to the ledger beside the spool's and hands the verdicts
to `llmmon.ranks.stall`, so the API, the metrics, the pages and `diagnose` speak of them as
of any rank.  A stack is shown in a rank's state (where it is, llmmon_rank_doing_info) only
while its job is suspect, as the reporter ships one only while its rank completes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from llmmon.ranks.discover import Follower, Found, Scanner, Seen
from llmmon.ranks.liveness import PidWatch
from llmmon.ranks.stacks import History, RankStack, StackVerdict, StackWatch
from llmmon.ranks.stacksampler import StackSampler
from llmmon.ranks.validate import Notes, RankState
from llmmon.sources.fs import RootedFS


@dataclass
class Pass:
    """One run's outcome."""

    states: list[tuple[Found, RankState]]
    verdicts: dict[str, StackVerdict]
    notes: Notes


@dataclass
class OutsideRanks:
    procfs: RootedFS
    sampler: StackSampler | None  # None: no py-spy, or turned off
    floor: float
    factor: float
    ceiling: float
    scanner: Scanner = field(init=False)
    follower: Follower = field(init=False)
    watches: dict[str, StackWatch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scanner = Scanner(self.procfs)
        self.follower = Follower(self.procfs)

    def run(self, now: float, reported: Mapping[tuple[str, int], int],
            watch: PidWatch | None) -> Pass:
        """Find the ranks but the `reported` ones ((job, rank) -> pid: the reporter's evidence
        wins; their DataLoader workers, which inherit the rank's environment, go with them),
        judge their jobs, write their states."""
        found = [r for r in self.scanner.scan(now, reported.values())
                 if (r.job_id, r.rank) not in reported]
        seen = self.follower.observe(found, now)
        histories = self.sampler.histories() if self.sampler else {}
        jobs: dict[str, list[Found]] = {}
        for rank in found:
            jobs.setdefault(rank.job_id, []).append(rank)
        verdicts = {}
        for job_id, ranks in jobs.items():
            judge = self.watches.get(job_id) or StackWatch(self.floor, self.factor,
                                                           self.ceiling)
            self.watches[job_id] = judge
            verdicts[job_id] = judge.judge(
                self._rank_stack(r, histories.get((r.pid, r.start_ticks)), seen[r.pid], watch,
                                 now) for r in ranks)
        self.watches = {job_id: w for job_id, w in self.watches.items() if job_id in jobs}
        if self.sampler is not None:  # quickly while a job looks hung, or is still learning
            self.sampler.want({(r.pid, r.start_ticks): verdicts[r.job_id].suspect
                               or not verdicts[r.job_id].learned for r in found})
        shown = {r.pid: history.latest for r in found
                 if (verdicts[r.job_id].suspect or verdicts[r.job_id].stalled)
                 and (history := histories.get((r.pid, r.start_ticks))) and history.latest}
        notes = Notes()
        return Pass(self.follower.states(found, now, shown, notes), verdicts, notes)

    @staticmethod
    def _rank_stack(rank: Found, history: History | None, seen: Seen, watch: PidWatch | None,
                    now: float) -> RankStack:
        """Its samples, whether it is stopped (the PID watch) and how long its training thread
        used no CPU (not the whole process': gloo's and the store's threads wake now and
        then in a hung rank)."""
        process = watch.get((rank.job_id, rank.rank, rank.pid)) if watch else None
        stopped = process is not None and process.visible and process.state in ("T", "t")
        still = now - seen.cpu_active if seen.main is not None else 0.0
        return RankStack(rank.rank, history or History(), stopped, max(0.0, still))
