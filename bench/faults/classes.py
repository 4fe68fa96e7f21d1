"""The fault classes: what is injected, where, for how long it is watched, and what counts as right.

A class names its culprit rank (global rank; `None` when no rank is to blame) and a cause
pattern: what a correct explanation says (a regular expression over what the daemon's API,
`llmmon diagnose` or the page said about the job).  Must-not-page classes are right when no
critical notification for their job arrives and no source blames a rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FaultClass:
    name: str
    fault: str  # the trainer's --fault
    culprit: int | None  # the global rank to blame; None: nobody
    cause: str  # regex a right explanation matches (case-insensitive)
    window: float  # seconds watched after the onset
    nproc: tuple[int, int] = (2, 2)  # ranks on node-a, node-b
    must_not_page: bool = False
    # tc qdiscs for the link between the nodes, tried in order (the first the kernel has is used)
    qdiscs: tuple[str, ...] = ()
    trainer_args: tuple[str, ...] = ()
    background: bool = False  # long: runs beside the others for the whole bench
    warmup: float = 30.0  # healthy seconds before the fault
    notes: str = ""
    also: tuple[int, ...] = ()  # ranks as much to blame as the culprit (none wrongly blamed)
    needs_page: bool = False  # watched until the notification names it too, in any run
    pages: bool = True  # False: the job ends, which pages nobody (the scheduler knows)
    incident: bool = False  # a hang (every node of the job keeps an incident) or an end

    @property
    def cause_re(self) -> re.Pattern[str]:
        return re.compile(self.cause, re.IGNORECASE)

    @property
    def world(self) -> int:
        return sum(self.nproc)


HANG_WINDOW = 330.0  # shipped defaults page ~250 s after the last completion, + group_wait 30 s
MESH_HEALTHY_WINDOW = 300.0
MESH = "mesh"  # `--classes mesh`: every class named mesh-...


def mesh_classes() -> tuple[FaultClass, ...]:
    """The mesh jobs' classes (bench/faults/meshjob.py): four ranks on a 2x2 DeviceMesh, rank 3
    the culprit (node-b; on these meshes every group of rank 3 but the world has a name, counted
    over the job's groups, other than the id rank 3 gives it).  The cause is the function the
    culprit stops in; `notes` says where the others wait (found with py-spy)."""
    def hang(name: str, parallel: str, fault: str, stop: str, notes: str) -> FaultClass:
        return FaultClass(f"{MESH}-{name}", fault, 3, stop, HANG_WINDOW, incident=True,
                          trainer_args=("--parallel", parallel), notes=notes)

    def healthy(parallel: str) -> FaultClass:
        return FaultClass(f"{MESH}-{parallel}-healthy", "none", None, r"$^",
                          MESH_HEALTHY_WINDOW, must_not_page=True, warmup=0.0,
                          trainer_args=("--parallel", parallel),
                          notes=f"healthy {parallel} job, {MESH_HEALTHY_WINDOW:.0f} s")

    return (
        hang("tp-hang", "fsdp-tp", "hang-tp", r"stuck_before_tp_op",
             "fsdp-tp: rank 3 never issues the row-wise layer's forward (its output's all-reduce "
             "over tp); waiting: rank 2 in that all-reduce (mesh_tp), ranks 1 and 0 in the next "
             "step's FSDP all-gather over dp (mesh_dp)"),
        hang("fsdp-hang", "fsdp-tp", "hang-fsdp", r"stuck_before_all_gather",
             "fsdp-tp: rank 3 never calls the model, whose pre-forward all-gathers the shards; "
             "waiting: rank 1 in FSDP's all-gather (mesh_dp), ranks 2 and 0 in tp all-reduces "
             "(mesh_tp)"),
        hang("backward-hang", "fsdp-tp", "hang-backward", r"stuck_in_backward",
             "fsdp-tp: rank 3 stops inside backward, between the two layers; waiting: rank 1 in "
             "FSDP's reduce-scatter (mesh_dp), ranks 2 and 0 in tp all-reduces (mesh_tp)"),
        hang("pp-forward", "pp", "pp-forward", r"stuck_in_stage_forward",
             "pp: rank 3 (stage 1) stops in its stage's forward; waiting: rank 2 (stage 0) in "
             "its pipeline send/recv (mesh_pp, which gloo's Flight Recorder does not record), "
             "ranks 1 and 0 in the gradient all-reduce over dp (mesh_dp)"),
        hang("pp-backward", "pp", "pp-backward", r"stuck_in_stage_backward",
             "pp: rank 3 (stage 1) stops in its stage's backward; waiting: rank 2 (stage 0) in "
             "its pipeline recv of the gradients (mesh_pp, not in gloo's Flight Recorder), "
             "ranks 1 and 0 in the gradient all-reduce over dp (mesh_dp)"),
        hang("ep-hang", "ep", "hang-ep", r"stuck_before_all_to_all",
             "ep: rank 3 never issues its MoE layer's all_to_all; waiting: rank 2 in the "
             "all_to_all (mesh_ep), ranks 1 and 0 in the world's gradient all-reduce"),
        hang("hsdp-hang", "hsdp", "hang-fsdp", r"stuck_before_all_gather",
             "hsdp: rank 3 never calls the model, whose pre-forward all-gathers the shards; "
             "waiting: rank 2 in the all-gather (mesh_shard), ranks 1 and 0 in the gradient "
             "all-reduce over replicate (mesh_replicate)"),
        *(healthy(parallel) for parallel in ("fsdp-tp", "hsdp", "pp", "ep")),
    )


def classes(healthy_seconds: float) -> tuple[FaultClass, ...]:
    """Every class; `healthy_seconds` is the length of the healthy run."""
    return (
        FaultClass("loader", "loader", 3, r"load_next_batch", HANG_WINDOW, incident=True,
                   notes="rank 3's data loader never returns (sleeps in load_next_batch)"),
        FaultClass("loader-all", "loader-all", 3, r"stuck before its next collective|"
                   r"no rank .*enqueued", HANG_WINDOW, incident=True, also=(0, 1, 2), needs_page=True,
                   notes="every rank's data loader never returns (a file system dead under all "
                   "of them): nobody waits inside a collective, so no rank is behind; right if "
                   "rank 3 (node-b) is named as stuck before its next collective"),
        FaultClass("lock", "lock", 3, r"update_metrics|\block\b", HANG_WINDOW, incident=True,
                   notes="rank 3 deadlocks on a lock it holds (update_metrics)"),
        FaultClass("exit", "exit", 3, r"\bexit\w*\b.*\b3\b|code 3", HANG_WINDOW, incident=True, pages=False,
                   notes="rank 3 calls sys.exit(3); torchrun tears the job down"),
        FaultClass("sigkill", "sigkill", 3, r"\bSIGKILL\b|signal 9|\bkilled\b", HANG_WINDOW, incident=True,
                   pages=False, notes="rank 3 is killed with SIGKILL; torchrun tears the job down"),
        FaultClass("sigstop", "sigstop", 3, r"\bstopped\b(?! reporting)|frozen|SIGSTOP", HANG_WINDOW, incident=True,
                   notes="rank 3 (reporter thread included) is frozen with SIGSTOP"),
        FaultClass("desync-size", "desync-size", 3, r"desync|mismatch|size", HANG_WINDOW, incident=True,
                   notes="rank 3 all-reduces 72 floats where its peers all-reduce 64"),
        FaultClass("desync-op", "desync-op", 3, r"desync|mismatch|broadcast", HANG_WINDOW, incident=True,
                   notes="rank 3 broadcasts where its peers all-reduce"),
        FaultClass("straggler", "straggler", 3, r"straggl|\blate\b|lag|slow", 900.0,
                   nproc=(3, 1), trainer_args=("--slow", "1.4"), background=True,
                   notes="rank 3, alone on node-b, takes 40 % longer per step; no timing mode"),
        FaultClass("straggler-3x", "straggler", 3, r"straggl|\blate\b|lag", 600.0,
                   nproc=(3, 1), trainer_args=("--slow", "3"),
                   notes="rank 3, alone on node-b, takes 3x as long per step: the job slows 2x "
                   "and more, node-a's ranks wait inside their collectives as for a slow link; "
                   "right if rank 3 is named late and the network is not blamed"),
        FaultClass("network", "none", None, r"network|netem|link|retransmi|loss", HANG_WINDOW,
                   qdiscs=("netem delay 40ms 10ms loss 5%",
                           "tbf rate 8mbit burst 32kbit latency 20ms"),
                   notes="the veth between the nodes degraded: netem 40±10 ms delay and 5 % loss, "
                   "or where the kernel has no sch_netem, tbf at 8 Mbit/s with a 20 ms queue "
                   "(it drops what does not fit: a lossy, congested link)"),
        FaultClass("network-delay", "none", None, r"suspect the network|round-trip|latency",
                   HANG_WINDOW, qdiscs=("netem delay 40ms 10ms",
                                        "tbf rate 8mbit burst 32kbit latency 400ms"),
                   notes="the veth between the nodes delays and drops nothing: netem 40±10 ms, "
                   "or where the kernel has no sch_netem, tbf at 8 Mbit/s with a 400 ms queue "
                   "(a congested lossless link); the cause is right only if the network is named "
                   "as the suspect, not listed among the possibilities"),
        FaultClass("starved", "starved", None, r"late together|suspect what they all do",
                   HANG_WINDOW, warmup=45.0,
                   notes="every rank's data loader takes 0.6 s longer a step (a slow input "
                   "pipeline): the job slows evenly like a slow link, but its ranks wait before "
                   "the collectives; right only if that is said and the network is not blamed"),
        FaultClass("nan", "nan", None, r"non-?finite|\bnan\b", 240.0,
                   notes="rank 3 reports a NaN loss every step"),
        FaultClass("fp16", "fp16", None, r"fp16|\bhalf\b|bf16", 1200.0, background=True,
                   warmup=0.0, notes="DDP fp16_compress_hook: every gradient reduction in Half"),
        FaultClass("healthy", "none", None, r"$^", healthy_seconds, must_not_page=True,
                   background=healthy_seconds > HANG_WINDOW, warmup=0.0,
                   notes=f"healthy run, {healthy_seconds:.0f} s"),
        FaultClass("checkpoint", "checkpoint", None, r"$^", 300.0, must_not_page=True,
                   trainer_args=("--pause", "90"),
                   notes="rank 0 writes a checkpoint for 90 s, the others wait in a barrier"),
        FaultClass("slow-start", "slow-start", None, r"$^", 300.0, must_not_page=True,
                   trainer_args=("--pause", "90"), warmup=0.0,
                   notes="first step: rank 0 'compiles' 90 s, the others 30 s"),
        *mesh_classes(),
    )


@dataclass
class Sighting:
    """The first time a source named the culprit (and, separately, the cause)."""

    named_at: float | None = None  # seconds after onset
    cause_at: float | None = None
    said: str = ""  # what it said when it first named the culprit (or first spoke)
    last: str = ""  # what it said at the last look (every node's view, once they all spoke)
    blamed_wrong: set[int] = field(default_factory=set)  # ranks it blamed that are not the culprit

    def observe(self, t: float, text: str, blamed: set[int], fault: FaultClass,
                job_id: str) -> None:
        """One look at a source: `text` is what it says about the job, `blamed` the ranks it
        blames.  The cause is looked for with the job id taken out (it holds the class's name)."""
        if not text:
            return
        self.last = text
        about = text.replace(job_id, "<job>")
        if fault.culprit is None:
            named = not blamed and bool(fault.cause_re.search(about))
        else:
            named = fault.culprit in blamed
        self.blamed_wrong |= blamed - ({fault.culprit} if fault.culprit is not None else set()) \
            - set(fault.also)
        if named and self.named_at is None:
            self.named_at, self.said = t, text
        if not self.said:
            self.said = text
        if self.cause_at is None and (named or fault.culprit is None) \
                and fault.cause_re.search(about):
            self.cause_at = t

    def as_json(self) -> dict[str, object]:
        return {"named_at": self.named_at, "cause_at": self.cause_at, "said": self.said[:4000],
                "last_said": self.last[:4000],
                "blamed_wrong": sorted(self.blamed_wrong)}


RANK_RE = re.compile(r"\brank (\d+)\b(?!\s+waits?\b|\s+\(waiting too\))", re.IGNORECASE)


def ranks_in(text: str) -> set[int]:
    """Ranks a line blames: every singular `rank N` in it, except `rank N waits` and `rank N
    (waiting too)` (waiters, as the plural `ranks 0-2 wait` are)."""
    return {int(m) for m in RANK_RE.findall(text)}
