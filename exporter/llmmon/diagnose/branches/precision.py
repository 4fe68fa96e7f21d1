"""Precision: is the job training in BF16, and is its loss finite?

The dtype of the gradient reductions (Flight Recorder entries) tells fp16 from bf16: an fp16
job reduces almost everything in `Half`.  Bytes moved during the window are judged when the job
moved any, else the totals since its ranks started (a dtype does not change mid-run).
"""

from __future__ import annotations

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import View, group, total

BYTES = "llmmon_nccl_collective_bytes_total"
NONFINITE = "llmmon_training_loss_nonfinite_total"


def gradient_dtype(view: View, t: Thresholds) -> Outcome:
    selector = f'coll=~"{t.reduction_collectives}"'
    moved = view.rate(BYTES, "10m", selector)
    if moved and total(moved) > 0:
        samples, basis = moved, "during the window"
    else:
        samples, basis = view.instant(BYTES, selector), "since the ranks started"
    if not samples:
        return unknown("no gradient reductions reported (no ranks in the spool, or no Flight "
                       "Recorder entries yet)")
    findings, worst_share = [], 0.0
    for (cluster, job), members in sorted(group(samples, "cluster", "job_id").items()):
        by_dtype = {dtype: total(s) for (dtype,), s in group(members, "dtype").items()}
        reduced = sum(by_dtype.values())
        if reduced <= 0:
            continue
        share = by_dtype.get("Half", 0.0) / reduced
        worst_share = max(worst_share, share)
        mix = ", ".join(f"{dtype} {d.percent(v / reduced)}"
                        for dtype, v in sorted(by_dtype.items(), key=lambda kv: -kv[1]))
        findings.append(d.evidence(members[0], ("job_id",),
                                   f"job {job}: {d.percent(share)} of the gradient-reduction "
                                   f"bytes are Half ({mix}) {basis}",
                                   half_share=share, bytes=reduced))
    if not findings:
        return unknown("gradient reductions carry no bytes yet")
    if worst_share > t.fp16_share:
        return suspect("gradients are reduced in fp16 (Half), not bf16", *findings)
    return ok("gradients are not reduced in fp16", *findings)


def loss_finite(view: View, t: Thresholds) -> Outcome:
    totals = view.instant(NONFINITE)
    if not totals:
        return unknown("no rank reports its loss (reporter.step(loss=...) not called)")
    recent = view.increase(NONFINITE, t.loss_nonfinite_window)
    if recent is None:
        return unknown(NEEDS_RATES)
    bad = [s for s in recent if s.value > 0]
    if bad:
        return suspect("the loss went NaN or infinite", *(
            d.evidence(s, d.RANK, f"{d.rank(s)}: {s.value:.0f} non-finite losses in the window",
                       nonfinite=s.value) for s in bad))
    earlier = [s for s in totals if s.value > 0]
    return ok("every reported loss in the window is finite", *(
        d.evidence(s, d.RANK, f"{d.rank(s)}: {s.value:.0f} non-finite losses before the window",
                   nonfinite_total=s.value) for s in earlier))


BRANCH = BranchSpec(
    "precision", "Precision", "Is the job training in BF16, with a finite loss?",
    (CheckSpec("gradient_dtype", "Gradient reductions in bf16", gradient_dtype,
               ("LLMTrainingNotBF16",), ("reduction_collectives", "fp16_share")),
     CheckSpec("loss_finite", "Finite loss", loss_finite, ("LLMTrainingLossNonFinite",),
               ("loss_nonfinite_window",))))
