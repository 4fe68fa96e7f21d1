"""The fault benchmark's one-node GPU variant: what one GPU's ranks can show (docs/faults.md).

    PYTHONPATH=exporter:reporter:. python3 -m bench.h200.faults_check OUT [--window 120]  # H200
    PYTHONPATH=exporter:reporter:. python3 -m bench.h200.faults_check OUT --dry-run  # CPU, gloo

One `llmmon serve` at its defaults and seven jobs at once under `llmmon launch` (torchrun
--standalone), every rank's "compute" bf16 matrix products on cuda:0 (bench/faults/trainer.py
--gpu).  NCCL puts one rank on a GPU, so the NCCL jobs have one rank (DDP over NCCL, the model in
bf16 on the GPU): a rank frozen with SIGSTOP, and one stuck in its data loader before the next
collective, and one whose loader slows 0.6 s a step (`starved-nccl`: where NCCL's ranks wait,
which the slowdown's cause reads, measured on NCCL).  The two-rank jobs train on the GPU and
all-reduce through a gloo group (the side group a one-GPU machine allows): rank 1 stuck in its
loader, rank 1 frozen, both starved; and a healthy one that must not be blamed.  It is
bench/faults/run.py's loop and scoring on one local node without Prometheus or Alertmanager
(the API and diagnose columns); latencies count from the fault's onset.  Writes
OUT/faults_h200.json and OUT/<job>.ranks.json (the API's answer when each class ended) and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.faults import run as fault_bench
from bench.faults.classes import FaultClass

STOPPED = r"\bstopped\b(?! reporting)|frozen|SIGSTOP"
STARVED = r"late together|suspect what they all do"
NEEDED = ("api", "diagnose")


def gpu_classes(window: float, dry_run: bool) -> list[FaultClass]:
    gpu = () if dry_run else ("--gpu",)
    nccl = gpu + ("--backend", "gloo" if dry_run else "nccl")
    return [
        FaultClass("sigstop-nccl", "sigstop", 0, STOPPED, window, nproc=(1,), trainer_args=nccl,
                   notes="one-rank NCCL job (bf16 DDP on the GPU), the rank frozen with SIGSTOP"),
        FaultClass("loader-nccl", "loader", 0, r"load_next_batch", window, nproc=(1,),
                   trainer_args=nccl,
                   notes="one-rank NCCL job, its data loader never returns"),
        FaultClass("loader-gloo", "loader", 1, r"load_next_batch", window, nproc=(2,),
                   trainer_args=gpu,
                   notes="two ranks on the GPU, gloo group: rank 1's loader never returns"),
        FaultClass("sigstop-gloo", "sigstop", 1, STOPPED, window, nproc=(2,), trainer_args=gpu,
                   notes="two ranks on the GPU, gloo group: rank 1 frozen with SIGSTOP"),
        FaultClass("starved-nccl", "starved", None, STARVED, window, nproc=(1,),
                   trainer_args=nccl, warmup=45.0,
                   notes="one-rank NCCL job, its loader 0.6 s slower a step from the onset: "
                   "right if the ranks are said to be late together, the network not blamed"),
        FaultClass("starved-gloo", "starved", None, STARVED, window, nproc=(2,),
                   trainer_args=gpu, warmup=45.0,
                   notes="two ranks on the GPU, gloo group, both loaders 0.6 s slower a step"),
        FaultClass("healthy-gpu", "none", None, r"$^", window, nproc=(2,), trainer_args=gpu,
                   must_not_page=True, warmup=0.0,
                   notes="two healthy ranks on the GPU beside the faults"),
    ]


def row(r: dict[str, Any]) -> str:
    src = r["sources"]
    error = f" ({r['error']})" if r["error"] else ""

    def cell(key: str) -> str:
        return f"{fault_bench._s(src[key]['named_at'])}/{fault_bench._s(src[key]['cause_at'])}"

    return (f"| {r['class']}{error} | "
            f"{fault_bench._yn(r['detected'])} | {fault_bench._yn(r['culprit_right'])} | "
            f"{fault_bench._yn(r['cause_right'])} | {cell('api')} | {cell('diagnose')} | "
            f"{', '.join(f'rank {n}' for n in r['blamed_wrong']) or '–'} |")


HEADER = ("| class | detected | culprit right | cause right | API s (named/cause) | "
          "diagnose s | ranks wrongly blamed |\n|---|---|---|---|---|---|---|")


def bench(faults: list[FaultClass], work: Path, out: Path) -> list[dict[str, Any]]:
    """Every class at once on one local node: the fault bench's loop, without its pages."""
    def done(result: dict[str, Any], ranks: dict[str, Any]) -> None:
        (out / f"{result['job_id']}.ranks.json").write_text(json.dumps(ranks))
        print(row(result), flush=True)
    return fault_bench.bench(faults, len(faults), work, NEEDED, names=("gpu-node",),
                             alerting=False, prefix="h200", poll=1.0, done=done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--window", type=float, default=120.0,
                        help="seconds watched after each onset (default 120)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: gloo on the CPU")
    parser.add_argument("--classes", default="",
                        help="comma-separated class names (default: every class)")
    args = parser.parse_args()
    chosen = gpu_classes(args.window, args.dry_run)
    if args.classes:
        names = args.classes.split(",")
        unknown = sorted(set(names) - {fault.name for fault in chosen})
        if unknown:
            parser.error(f"unknown classes {unknown}; known: {[f.name for f in chosen]}")
        chosen = [fault for fault in chosen if fault.name in names]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="llmmon-h200-faults-"))
    started = time.time()
    results = bench(chosen, work, args.out)
    print(HEADER)
    for result in results:
        print(row(result))
    print(fault_bench.said(results))
    meta = {"machine": platform.node(), "dry_run": args.dry_run, "window_s": args.window,
            "seconds": round(time.time() - started, 1), "work": str(work)}
    (args.out / "faults_h200.json").write_text(json.dumps({"meta": meta, "results": results},
                                                          indent=1))
    return 0 if all(r["error"] == "" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
