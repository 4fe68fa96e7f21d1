"""Hang: has the job stopped making progress, and what stopped it?

Per process group, the ranks that enqueued the oldest collective the group has not completed
wait in it; a rank whose last enqueued sequence number is below it never entered it (the
Flight Recorder rule `llmmon diagnose --ranks` details).  A group is hung when that collective
has been outstanding for longer than the alert's window, measured from the last progress the
daemon saw or the collective's own enqueue time, whichever is longer.  Then the causes: ranks
that issued different collectives at one sequence number (a desync), a lost GPU or a critical
XID, RDMA loss and retransmits, ports down or flapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Evidence, Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import Sample, View, group, index, key, total
from llmmon.options import parse_duration
from llmmon.ranks.stall import spans_text

GROUP_KEY = ("cluster", "job_id", "pg")
MEMBER_KEY = ("cluster", "job_id", "rank", "pg")
LOSS = "node_device_port:llmmon_rdma_loss_events:rate5m"
PORT_KEY = ("cluster", "node", "device", "port")
RANK_KEY = ("cluster", "job_id", "rank")
Key = tuple[str, ...]


def _ranks(samples: list[Sample]) -> list[int]:
    return sorted(int(s.get("rank")) for s in samples if s.get("rank").isdigit())


def _doing(sample: Sample | None, idle: Sample | None) -> str:
    """`: it is in load_next_batch (data.py:41), sleeping, no CPU for 35 s` (from the
    daemon's llmmon_rank_doing_info and llmmon_rank_cpu_idle_seconds), or nothing."""
    if sample is None:
        return ""
    parts = [f"in {sample.get('where')}" if sample.get("where") else "outside any collective"]
    parts += [sample.get("state")] if sample.get("state") else []
    parts += [f"no CPU for {d.seconds(idle.value)}"] if idle is not None else []
    return ": it is " + ", ".join(parts)


def _busy(ranks: list[Sample], idle: list[dict[Key, Sample]], t: Thresholds) -> list[Sample]:
    """The ranks that used CPU or I/O within `hang_busy_seconds`: at work (an evaluation, a
    checkpoint), not stuck."""
    return [m for m in ranks if any(
        i.get(key(m, RANK_KEY)) is not None and i[key(m, RANK_KEY)].value < t.hang_busy_seconds
        for i in idle)]


def _quiet(t: Thresholds, members: list[Sample], head: str, quiet: list[Sample],
           window: float, idle: list[dict[tuple[str, ...], Sample]],
           doing: dict[tuple[str, ...], Sample]) -> tuple[bool, list[Evidence]]:
    """Nothing in flight: hung when no rank enqueued anything for longer than the window on
    every node (`llmmon_nccl_quiet_seconds`, 0 on a node whose ranks progress) and no rank
    works, as LLMTrainingHang{reason="no_rank_enqueues"} judges.  (hung, evidence): the
    group's and one per rank; one calm line while a rank works; nothing while within it."""
    seconds = min((s.value for s in quiet), default=0.0)
    if seconds <= window:
        return False, []
    text = (f"{head}: nothing in flight and no rank enqueued a collective for "
            f"{d.seconds(seconds)} (window {window:.0f} s)")
    working = _busy(members, idle, t)
    if working:
        return False, [d.evidence(members[0], ("job_id", "pg"), f"{text}: {d.rank(working[0])} "
                                  "works (CPU or I/O): an evaluation or a checkpoint, not a hang")]
    return True, [d.evidence(members[0], ("job_id", "pg"), f"{text}: every rank is stuck before "
                             "its next collective", stalled_seconds=seconds)] + [
        d.evidence(m, ("job_id", "rank", "pg"), f"{d.rank(m)} enqueued nothing since "
                   f"#{m.value:.0f}" + _doing(doing.get(key(m, RANK_KEY)),
                                              idle[0].get(key(m, RANK_KEY))),
                   last_enqueued=m.value)
        for m in members]


@dataclass(frozen=True)
class _Daemon:
    """What the daemon exports beside the sequence numbers, indexed once for every group:
    completions, progress, and its own judgement where the exporter has it (learned threshold,
    measured stall, ended ranks, busy ranks, what a rank behind is doing)."""

    completed: dict[Key, Sample]
    noted: dict[Key, list[Sample]]
    inflight: dict[Key, list[Sample]]
    learned: dict[Key, list[Sample]]
    measured: dict[Key, list[Sample]]
    quiet: dict[Key, list[Sample]]
    ended: set[Key]  # (cluster, job_id) of the jobs with a rank no longer alive
    idle: list[dict[Key, Sample]]  # seconds without CPU, then without I/O, per rank
    doing: dict[Key, Sample]
    waiting: set[Key]  # ranks inside an operation of one of their groups: never to blame

    def elsewhere(self, members: list[Sample]) -> list[Sample]:
        """The members that wait inside another group's operation (llmmon_rank_waiting)."""
        return [m for m in members if key(m, RANK_KEY) in self.waiting]

    @classmethod
    def read(cls, view: View) -> _Daemon:
        return cls(
            completed=index(view.instant("llmmon_nccl_last_completed_seq"), *MEMBER_KEY),
            noted=group(view.instant("llmmon_nccl_last_progress_timestamp_seconds"), *GROUP_KEY),
            inflight=group(view.instant("llmmon_nccl_oldest_inflight_age_seconds"), *GROUP_KEY),
            learned=group(view.instant("llmmon_nccl_stall_threshold_seconds"), *GROUP_KEY),
            measured=group(view.instant("llmmon_nccl_stalled_seconds"), *GROUP_KEY),
            quiet=group(view.instant("llmmon_nccl_quiet_seconds"), *GROUP_KEY),
            ended={key(s, ("cluster", "job_id")) for s in view.instant("llmmon_rank_alive")
                   if s.value == 0},
            idle=[index(view.instant(name), *RANK_KEY) for name in
                  ("llmmon_rank_cpu_idle_seconds", "llmmon_rank_io_idle_seconds")],
            doing=index(view.instant("llmmon_rank_doing_info"), *RANK_KEY),
            waiting={key(s, RANK_KEY) for s in view.instant("llmmon_rank_waiting")
                     if s.value == 1})

    def window(self, where: Key, t: Thresholds) -> float:
        """The group's learned stall threshold, else the alert's window."""
        return max((s.value for s in self.learned.get(where, [])), default=t.hang_window_seconds)

    def stalled(self, where: Key, now: float) -> float:
        """Seconds since the group's last progress or its oldest collective's enqueue time,
        whichever is longer."""
        since = max((now - s.value for s in self.noted.get(where, [])), default=0.0)
        oldest = max((s.value for s in self.inflight.get(where, [])), default=0.0)
        return max(since, oldest)


@dataclass(frozen=True)
class _Group:
    """One process group at its frontier: the oldest collective it has not completed."""

    where: Key  # cluster, job_id, pg
    members: list[Sample]  # each rank's last enqueued sequence number
    frontier: int

    @property
    def head(self) -> str:
        return f"job {self.where[1]}, group {self.where[2]}"

    @property
    def waiting(self) -> list[Sample]:
        return [m for m in self.members if m.value >= self.frontier]

    @property
    def behind(self) -> list[Sample]:
        """The ranks that never entered the frontier collective."""
        return [m for m in self.members if m.value < self.frontier]


def _judge(view: View, t: Thresholds, daemon: _Daemon, g: _Group) -> tuple[bool, list[Evidence]]:
    """(hung, evidence) of one group."""
    if g.where[:2] in daemon.ended:
        return False, [d.evidence(g.members[0], ("job_id", "pg"), f"{g.head}: a rank of the job "
                                  "ended (llmmon_rank_alive 0): the job ended, not a hang")]
    if not g.waiting:
        elsewhere = daemon.elsewhere(g.members)
        if len(elsewhere) == len(g.members):
            return False, [d.evidence(g.members[0], ("job_id", "pg"), f"{g.head}: nothing in "
                                      "flight; its ranks wait inside other groups' operations")]
        stuck, found = _quiet(t, [m for m in g.members if m not in elsewhere], g.head,
                              daemon.quiet.get(g.where, []), daemon.window(g.where, t),
                              daemon.idle, daemon.doing)
        return stuck, found or [d.evidence(
            g.members[0], ("job_id", "pg"),
            f"{g.head}: nothing in flight (last completed #{g.frontier - 1})")]
    return _in_flight(view, t, daemon, g)


def _in_flight(view: View, t: Thresholds, daemon: _Daemon, g: _Group
               ) -> tuple[bool, list[Evidence]]:
    """A collective is outstanding: hung past the group's window (or, whatever the daemon
    measured, past the alert's ceiling) unless a rank behind is busy within that ceiling."""
    stalled = daemon.stalled(g.where, view.now)
    window = daemon.window(g.where, t)
    judged = max((s.value for s in daemon.measured.get(g.where, [])), default=stalled)
    text = (f"{g.head}: ranks {spans_text(_ranks(g.waiting))} wait in collective #{g.frontier} "
            f"for {d.seconds(stalled)}")
    busy = _busy(g.behind, daemon.idle, t) if stalled <= t.hang_window_seconds else []
    if (judged <= window and stalled <= t.hang_window_seconds) or busy:
        note = (f"{d.rank(busy[0])} is busy (CPU or I/O in the last "
                f"{t.hang_busy_seconds:.0f} s): not a hang before the "
                f"{t.hang_window_seconds:.0f} s ceiling" if busy else
                f"within the {window:.0f} s window")
        return False, [d.evidence(g.members[0], ("job_id", "pg"), f"{text} ({note})",
                                  stalled_seconds=stalled)]
    elsewhere = daemon.elsewhere(g.behind)
    behind = [m for m in g.behind if m not in elsewhere]
    if elsewhere:
        text += "; " + "; ".join(f"rank {m.get('rank')} waits inside another group's "
                                 f"operation{d.on_node(m)}: not the rank behind"
                                 for m in elsewhere)
    elif not behind:
        text += ("; every reporting rank entered it and none completes: the rank behind is "
                 "on a node not seen here, or suspect the GPUs and the network")
    return True, [d.evidence(g.members[0], ("job_id", "pg"), text, stalled_seconds=stalled,
                             seq=g.frontier)] + [
        d.evidence(m, ("job_id", "rank", "pg"), f"{d.rank(m)} never enqueued collective "
                   f"#{g.frontier} of group {g.where[2]} (last enqueued #{m.value:.0f}): it is "
                   "the rank behind" + _doing(daemon.doing.get(key(m, RANK_KEY)),
                                              daemon.idle[0].get(key(m, RANK_KEY))),
                   last_enqueued=m.value)
        for m in behind]


def progress(view: View, t: Thresholds) -> Outcome:
    enqueued = view.instant("llmmon_nccl_last_enqueued_seq")
    if not enqueued:
        return unknown("no rank reports NCCL progress (no ranks in the spool)")
    daemon = _Daemon.read(view)
    hung: list[Evidence] = []
    calm: list[Evidence] = []
    for where, members in sorted(group(enqueued, *GROUP_KEY).items()):
        done = [daemon.completed[key(m, MEMBER_KEY)].value for m in members
                if key(m, MEMBER_KEY) in daemon.completed]
        if not done:
            continue
        stuck, found = _judge(view, t, daemon, _Group(where, members, int(min(done)) + 1))
        (hung if stuck else calm).extend(found)
    if hung:
        return suspect("a process group stopped making progress; dump the Flight Recorder "
                       "(llmmon diagnose --ranks --dump) before the NCCL watchdog kills the job",
                       *hung)
    return ok("every process group makes progress", *calm)


def desync(view: View, t: Thresholds) -> Outcome:
    """The ranks' vote on each group's in-flight collective (what LLMTrainingDesync takes)."""
    issued = view.instant("llmmon_nccl_inflight_collective_info")
    if not issued:
        return unknown("no process group has waited 5 s in a collective (nothing to compare)")
    usual = {key(s, (*GROUP_KEY, "seq")): s.get("signature")
             for s in view.instant("llmmon_nccl_desync_usual_info")}
    found = []
    for where, members in sorted(group(issued, *GROUP_KEY, "seq").items()):
        votes: dict[str, list[Sample]] = {}
        for member in members:
            votes.setdefault(member.get("signature"), []).append(member)
        if len(votes) < 2:
            continue
        # a tie the daemon broke with the group's history: the usual signature first
        ranked = sorted(votes.items(), key=lambda item: (-len(item[1]),
                                                         item[0] != usual.get(where)))
        if len(ranked[0][1]) == len(ranked[1][1]) and ranked[0][0] != usual.get(where):
            each = "; ".join(f"{d.rank(m)}: {m.get('signature')}" for m in members)
            found.append(d.evidence(members[0], ("job_id", "pg"), f"job {where[1]} group "
                                    f"{where[2]} collective #{where[3]}: the ranks disagree "
                                    f"({each}) and none is in the minority", ranks=len(members)))
            continue
        major, voters = ranked[0]
        backed = " (as the group did before)" if major == usual.get(where) else ""
        found += [d.evidence(m, ("job_id", "rank", "pg"), f"{d.rank(m)} issued "
                             f"{m.get('signature')} as collective #{where[3]} of group "
                             f"{where[2]}, where {len(voters)} ranks issued {major}{backed}: a "
                             "desync", ranks=len(members))
                  for minority in ranked[1:] for m in minority[1]]
    if found:
        return suspect("ranks of a process group issued different collectives at one sequence "
                       "number (a desync): fix the code path of the odd rank", *found)
    return ok("the ranks of every waiting group issued the same collective")


def gpu_errors(view: View, t: Thresholds) -> Outcome:
    up = view.instant("llmmon_gpu_up")
    if not up:
        return unknown("no NVML GPUs")
    found = [d.evidence(s, d.GPU, f"{d.gpu(s)} ({s.get('uuid')}) does not answer NVML (lost, "
                        "needs a reset or fell off the bus)", up=0.0)
             for s in up if s.value == 0]
    alert = "GPULost" if found else ""
    window = parse_duration(t.xid_window)
    counts = index(view.instant("llmmon_gpu_xid_errors_total"), "cluster", "node", "uuid", "xid")
    critical = {str(x) for x in t.xid_critical}
    for last in view.instant("llmmon_gpu_xid_last_timestamp_seconds"):
        age = view.now - last.value
        if age > window:
            continue
        count = counts.get(key(last, ("cluster", "node", "uuid", "xid")))
        kind = "critical" if last.get("xid") in critical else "non-critical"
        found.append(d.evidence(last, (*d.GPU, "xid"), f"{d.gpu(last)}: {kind} XID "
                                f"{last.get('xid')}, last {d.seconds(age)} ago"
                                f"{f' ({count.value:.0f} in all)' if count else ''}",
                                age_seconds=age))
    alert = alert or ("GPUXidError" if found else "")
    ecc = view.increase("llmmon_gpu_ecc_errors_total", t.ecc_window, 'severity="uncorrected"')
    for (gpu, members) in group(ecc or [], "cluster", "node", "uuid").items():
        grown = max(s.value for s in members)
        if grown > 0:
            found.append(d.evidence(members[0], d.GPU, f"{d.gpu(members[0])}: {grown:.0f} new "
                                    "uncorrectable ECC errors", uncorrected=grown))
    found += [d.evidence(s, d.GPU, f"{d.gpu(s)}: a memory row remap waits for a GPU reset",
                         row_remap_pending=1.0)
              for s in view.instant("llmmon_gpu_row_remap_pending") if s.value == 1]
    if found:
        return suspect("a GPU is lost or reports errors; its ranks hang or die", *found,
                       alert=alert or "GPUEccUncorrectable")
    return ok(f"{len(up)} GPUs answer, no XID in the last {t.xid_window}, no new uncorrectable "
              "errors")


def rdma_loss(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_rdma_port_info"):
        return unknown("no RDMA ports")
    events = view.rule(LOSS)
    if events is None:
        return unknown(NEEDS_RATES)
    rows = []
    for where, counters in sorted(group(events, *PORT_KEY).items()):
        rate = total(counters)
        detail = ", ".join(f"{s.get('counter')} {s.value:.3g}/s" for s in counters if s.value > 0)
        rows.append((rate, d.evidence(counters[0], d.PORT, f"{d.port(counters[0])}: {rate:.3g} "
                                      f"loss events/s{f' ({detail})' if detail else ''}",
                                      loss_events_per_second=rate)))
    bad = [item for rate, item in rows if rate > t.rdma_loss_events_per_second]
    if bad:
        return suspect("RDMA ports lose or retransmit packets: check cables, optics and PFC "
                       "on the RoCE priority", *bad)
    return ok(f"no loss or retransmission on {len(rows)} RDMA ports" if rows
              else "no RDMA loss counters on these ports")


def links(view: View, t: Thresholds) -> Outcome:
    ports = view.instant("llmmon_rdma_port_up", t.rdma_port_selector)
    if not ports:
        return unknown("no RDMA ports")
    found = [d.evidence(s, d.PORT, f"{d.port(s)} is down", up=0.0) for s in ports if s.value == 0]
    alert = "RDMALinkDown" if found else "RDMALinkFlapping"
    downed = view.increase("llmmon_rdma_link_downed_total", t.link_flap_window)
    carrier = view.increase("llmmon_netdev_carrier_changes_total", t.link_flap_window)
    if downed is None or carrier is None:
        note = " (flaps need two observations)"
    else:
        note = ""
        found += [d.evidence(s, d.PORT, f"{d.port(s)} went down {s.value:.0f} times in the "
                             "window", link_downed=s.value)
                  for s in downed if s.value >= t.link_flap_downs]
        rdma_netdevs = {key(s, ("cluster", "node", "netdev")): s
                        for s in view.instant("llmmon_rdma_port_info") if s.get("netdev")}
        for change in carrier:
            port = rdma_netdevs.get(key(change, ("cluster", "node", "netdev")))
            if port is not None and change.value >= t.link_flap_carrier_changes:
                found.append(d.evidence(port, (*d.PORT, "netdev"), f"carrier of "
                                        f"{change.get('netdev')} ({d.port(port)}) changed "
                                        f"{change.value:.0f} times in the window",
                                        carrier_changes=change.value))
    if found:
        return suspect("RDMA links are down or flapping; collectives crossing them stall", *found,
                       alert=alert)
    return ok(f"{len(ports)} RDMA ports up, no flap{note}")


BRANCH = BranchSpec(
    "hang", "Distributed hang", "Has the job stopped making progress, and what stopped it?",
    (CheckSpec("progress", "Collective progress", progress,
               ("LLMTrainingHang", "LLMTrainingHangNodes"),
               ("hang_window_seconds", "hang_busy_seconds")),
     CheckSpec("desync", "Desync", desync, ("LLMTrainingDesync",), ()),
     CheckSpec("gpu_errors", "Lost GPUs and XIDs", gpu_errors,
               ("GPULost", "GPUXidError", "GPUEccUncorrectable"),
               ("xid_critical", "xid_window", "ecc_window")),
     CheckSpec("rdma_loss", "RDMA loss and retransmits", rdma_loss, ("RDMAPacketLoss",),
               ("rdma_loss_events_per_second",)),
     CheckSpec("links", "RDMA links", links, ("RDMALinkDown", "RDMALinkFlapping"),
               ("rdma_port_selector", "link_flap_window", "link_flap_downs",
                "link_flap_carrier_changes"))))
