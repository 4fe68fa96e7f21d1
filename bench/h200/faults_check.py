"""The fault benchmark's one-node GPU variant (issue 13): what one GPU's ranks can show.

    PYTHONPATH=.src:. python3 -m bench.h200.faults_check OUT [--window 120]   # on the H200
    PYTHONPATH=.src:. python3 -m bench.h200.faults_check OUT --dry-run        # CPU, gloo only

One `llmmon serve` at its defaults and five jobs at once under `llmmon launch` (torchrun
--standalone), every rank's "compute" bf16 matrix products on cuda:0 (bench/faults/trainer.py
--gpu).  NCCL puts one rank on a GPU, so the NCCL jobs have one rank (DDP over NCCL, the model in
bf16 on the GPU): a rank frozen with SIGSTOP, and one stuck in its data loader before the next
collective.  The two-rank jobs train on the GPU and all-reduce through a gloo group (the side
group a one-GPU machine allows): rank 1 stuck in its loader, rank 1 frozen; and a healthy one
that must not be blamed.  Latencies count from the fault's onset, as in bench/faults/run.py,
whose watchers and scoring this reuses (no Prometheus or Alertmanager here: API and diagnose).
Writes OUT/faults_h200.json and prints the table.
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
from bench.faults import watch
from bench.faults.classes import FaultClass
from bench.faults.cluster import Cluster, Job

STOPPED = r"\bstopped\b(?! reporting)|frozen|SIGSTOP"
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
    results: list[dict[str, Any]] = []
    with Cluster(work, names=("gpu-node",), alerting=False) as cluster:
        node = cluster.nodes[0]
        active = []
        for index, fault in enumerate(faults, 1):
            job = Job(cluster, f"h200-{fault.name}", index, fault.nproc,
                      ["--fault", fault.fault, "--culprit",
                       str(fault.culprit if fault.culprit is not None else -1),
                       "--duration", str(fault.warmup + fault.window + 300),
                       *fault.trainer_args], local=True)
            active.append(fault_bench.Run(fault, job))
            job.__enter__()
        polls = 0
        try:
            while active:
                now = time.time()
                ranks = cluster.ranks()
                diagnosed = ({node.name: watch.diagnose_text(node.url)}
                             if polls % fault_bench.DIAGNOSE_EVERY == 0 else {})
                for run in list(active):
                    try:
                        fault_bench._step(run, now, ranks, diagnosed, [], NEEDED)
                    except Exception as exc:  # noqa: BLE001 (one class failing ends only it)
                        run.error, run.phase = f"{type(exc).__name__}: {exc}"[:300], "done"
                    if run.phase == "done":
                        (out / f"{run.job.job_id}.ranks.json").write_text(json.dumps(ranks))
                        run.job.__exit__()
                        active.remove(run)
                        results.append(run.result())
                        print(row(results[-1]), flush=True)
                polls += 1
                time.sleep(max(0.0, 1.0 - (time.time() - now)))
        finally:
            for run in active:
                run.job.__exit__()
                run.error = run.error or "interrupted"
                results.append(run.result())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--window", type=float, default=120.0,
                        help="seconds watched after each onset (default 120)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: gloo on the CPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="llmmon-h200-faults-"))
    started = time.time()
    results = bench(gpu_classes(args.window, args.dry_run), work, args.out)
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
