"""Memory: has a rank run out of GPU memory, or is it about to?

Signals of the PyTorch caching allocator per rank: OOMs, allocator retries (a failed cudaMalloc
that flushed the cache: the step before an OOM), reserved memory near the card's size, and
reserved memory that holds no tensor (fragmentation).  Judged at this instant: the alerts wait
15-30 minutes because allocated memory swings within every step.
"""

from __future__ import annotations

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import View, index, key

RESERVED_SHARE = "job_id_rank:llmmon_torch_memory_reserved_per_gpu_memory:ratio"
FRAGMENTATION = "job_id_rank:llmmon_torch_memory_fragmentation:ratio"
RANK_KEY = ("cluster", "job_id", "rank")
NO_ALLOCATOR = "no rank reports allocator statistics (no CUDA ranks in the spool)"


def _counter_check(view: View, name: str, window: str, what: str, remedy: str) -> Outcome:
    totals = view.instant(name)
    if not totals:
        return unknown(NO_ALLOCATOR)
    recent = view.increase(name, window)
    if recent is None:
        return unknown(NEEDS_RATES)
    bad = [s for s in recent if s.value > 0]
    if bad:
        return suspect(f"{what} in the window; {remedy}", *(
            d.evidence(s, d.RANK, f"{d.rank(s)}: {s.value:.0f} {what} in the window",
                       increase=s.value) for s in bad))
    earlier = [s for s in totals if s.value > 0]
    return ok(f"no {what} in the window", *(
        d.evidence(s, d.RANK, f"{d.rank(s)}: {s.value:.0f} {what} before the window",
                   total=s.value) for s in earlier))


REMEDY = "activation checkpointing, FSDP2 sharding, expandable_segments, a smaller micro-batch"


def ooms(view: View, t: Thresholds) -> Outcome:
    return _counter_check(view, "llmmon_torch_ooms_total", t.oom_window,
                          "out-of-memory errors", REMEDY)


def alloc_retries(view: View, t: Thresholds) -> Outcome:
    return _counter_check(view, "llmmon_torch_alloc_retries_total", t.oom_risk_retries_window,
                          "allocator retries (cudaMalloc failed, cache flushed)", REMEDY)


def reserved_capacity(view: View, t: Thresholds) -> Outcome:
    shares = view.rule(RESERVED_SHARE) or []
    if not shares:
        return unknown(NO_ALLOCATOR + " or their GPUs are unknown")
    found = [d.evidence(s, (*d.RANK, "uuid"), f"{d.rank(s)}: PyTorch reserves "
                        f"{d.percent(s.value)} of {s.get('uuid')}", reserved_share=s.value)
             for s in sorted(shares, key=lambda s: -s.value)]
    if shares and max(s.value for s in shares) > t.oom_risk_reserved_ratio:
        return suspect("reserved memory is at the card's capacity: the next larger peak fails",
                       *(e for e in found if e.values["reserved_share"]
                         > t.oom_risk_reserved_ratio))
    return ok(f"the fullest rank reserves {d.percent(max(s.value for s in shares))} of its GPU",
              *found[:1])


def fragmentation(view: View, t: Thresholds) -> Outcome:
    ratios = view.rule(FRAGMENTATION) or []
    if not ratios:
        return unknown(NO_ALLOCATOR)
    shares = index(view.rule(RESERVED_SHARE) or [], *RANK_KEY)
    reserved = index(view.instant("llmmon_torch_memory_reserved_bytes"), *RANK_KEY)
    allocated = index(view.instant("llmmon_torch_memory_allocated_bytes"), *RANK_KEY)
    bad, seen = [], []
    for ratio in sorted(ratios, key=lambda s: -s.value):
        rank = key(ratio, RANK_KEY)
        share = shares.get(rank)
        numbers = {"unallocated_share": ratio.value}
        if share is not None:
            numbers["reserved_share"] = share.value
        detail = ""
        if rank in reserved and rank in allocated:
            detail = (f" ({d.size(reserved[rank].value)} reserved, "
                      f"{d.size(allocated[rank].value)} allocated)")
        item = d.evidence(ratio, d.RANK, f"{d.rank(ratio)}: {d.percent(ratio.value)} of reserved "
                          f"memory holds no tensor{detail}", **numbers)
        seen.append(item)
        if (ratio.value > t.fragmentation_ratio and share is not None
                and share.value > t.fragmentation_reserved_ratio):
            bad.append(item)
    if bad:
        return suspect("reserved memory is large and mostly unallocated at this instant (set "
                       "PYTORCH_ALLOC_CONF=expandable_segments:True)", *bad)
    return ok("no rank holds a large reservation that is mostly unallocated", *seen[:1])


BRANCH = BranchSpec(
    "memory", "Memory", "Has a rank run out of GPU memory, or is it about to?",
    (CheckSpec("ooms", "Out-of-memory errors", ooms, ("GPUMemoryOOM",), ("oom_window",)),
     CheckSpec("alloc_retries", "Allocator retries", alloc_retries, ("GPUMemoryOOMRisk",),
               ("oom_risk_retries_window",)),
     CheckSpec("reserved_capacity", "Reserved memory vs the card", reserved_capacity,
               ("GPUMemoryOOMRisk",), ("oom_risk_reserved_ratio",)),
     CheckSpec("fragmentation", "Fragmentation", fragmentation, ("GPUMemoryFragmentation",),
               ("fragmentation_ratio", "fragmentation_reserved_ratio"))))
