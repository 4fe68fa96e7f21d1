"""The fault benchmark's training job: a small DDP model on gloo, one fault injected on request.

Run by torchrun under `llmmon launch` (the reporter starts through the launcher's hook; this
script only calls `reporter.step()`).  Every step: a data-loader call, "compute" (a sleep of
`--step` seconds), DDP's gradient all-reduce, the optimiser.  The harness
asks for the fault by writing a step number into `<ctl>/go`; the culprit rank(s) write `<ctl>/onset.<rank>` (Unix
time) the moment they inject it, so latencies count from the fault itself.  Faults (`--fault`):

  loader      the culprit's data loader never returns (sleeps in `load_next_batch`)
  loader-all  every rank's data loader never returns (a file system dead under all of them)
  lock        the culprit deadlocks on a lock it already holds
  exit        the culprit exits with code 3 (sys.exit)
  sigkill     the culprit is killed (SIGKILL)
  sigstop     the culprit is frozen, reporter thread included (SIGSTOP)
  desync-size the culprit all-reduces a tensor of another size at the same sequence number
  desync-op   the culprit broadcasts where its peers all-reduce
  straggler   the culprit's compute takes `--slow` times longer from then on (no hang)
  starved     every rank's data loader takes `--starve` s longer from then on (a slow input
              pipeline: the job slows evenly, and the time is spent before the collectives)
  checkpoint  rank 0 writes a checkpoint for `--pause` s while every other rank waits in a barrier
  slow-start  the first step is slow: rank 0 `--pause` s, the others a third of it (compilation)
  nan         the culprit reports a NaN loss every step from then on
  fp16        gradients are all-reduced in fp16 (DDP's fp16 compression hook) from the start
  none        healthy (also: network, whose fault the harness injects with tc on the link)

`--parallel` other than `ddp` runs one of the mesh jobs of bench/faults/meshjob.py instead
(FSDP with tensor parallelism, HSDP, pipeline, expert parallelism; faults of their own).

With `--gpu` (the H200 variant, bench/h200/faults_check.py) the "compute" is bf16 matrix
products on cuda:0 for `--step` seconds instead of a sleep; with `--backend nccl` (one rank per
GPU, so a one-rank job on a one-GPU machine) the model is bf16 on the GPU and DDP all-reduces its
gradients through NCCL, which the Flight Recorder then records.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:
    import llmmon_reporter as reporter
except ImportError:  # run without `llmmon launch`: no step reports
    reporter = None  # type: ignore[assignment]

LOCK = threading.Lock()
NEVER = threading.Event()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctl", required=True, type=Path, help="control directory")
    parser.add_argument("--fault", default="none")
    parser.add_argument("--culprit", type=int, default=-1)
    parser.add_argument("--step", type=float, default=0.2, help="seconds per step")
    parser.add_argument("--slow", type=float, default=1.4, help="straggler's step factor")
    parser.add_argument("--starve", type=float, default=0.6,
                        help="seconds every rank's loader adds per step when starved")
    parser.add_argument("--pause", type=float, default=90.0,
                        help="checkpoint / slow-start seconds")
    parser.add_argument("--duration", type=float, default=3600.0, help="stop after (s)")
    parser.add_argument("--gpu", action="store_true", help="compute: bf16 matmuls on cuda:0")
    parser.add_argument("--backend", default="gloo", help="the default group's backend")
    parser.add_argument("--parallel", default="ddp",
                        choices=("ddp", "fsdp-tp", "hsdp", "pp", "ep"),
                        help="ddp, or a mesh job of bench/faults/meshjob.py (4 ranks)")
    return parser.parse_args()


def load_next_batch(step: int, rank: int, stuck: bool, starve: float = 0.0) -> torch.Tensor:
    """The data loader; a stuck one sleeps here for ever (a dead NFS read, a lost worker), a
    starved one `starve` s a batch (a slow shared file system, too few loader workers)."""
    if stuck:
        NEVER.wait()
    time.sleep(starve)
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(step * 100 + rank))


def update_metrics(stuck: bool) -> None:
    """A metrics update guarded by a lock; the deadlocked one takes the lock it holds."""
    with LOCK:
        if stuck:
            with LOCK:
                pass


def save_checkpoint(model: torch.nn.Module, path: Path, seconds: float) -> None:
    """Rank 0's slow checkpoint: the state dict written again and again for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        torch.save(model.state_dict(), path)
        time.sleep(0.5)


def gpu_compute(seconds: float, work: list[torch.Tensor]) -> None:
    """bf16 matrix products on the GPU for `seconds` (synchronised: the step's own time)."""
    deadline = time.monotonic() + seconds
    while True:
        work[0] = torch.tanh(work[0] @ work[1])
        torch.cuda.synchronize()
        if time.monotonic() >= deadline:
            return


def fault_step(go: Path) -> float:
    """The step the fault starts at: `go` holds it (a few steps ahead of the fastest rank, so
    that every rank injects at the same step and a desync is one at the same sequence number)."""
    try:
        return int(go.read_text())
    except (OSError, ValueError):
        return float("inf")


def mark_onset(ctl: Path, rank: int) -> None:
    (ctl / f"onset.{rank}").write_text(f"{time.time():.3f}\n")


def report_step(ctl: Path, rank: int, step: int, loss: torch.Tensor | None, nan: bool) -> None:
    """A finished step: to the reporter (steps, tokens, the loss: None on a pipeline's first
    stage) when it runs, and, every ten steps, into `<ctl>/step.<rank>` for the harness, which
    sees no steps of a job without it."""
    if reporter is not None:
        reporter.step(tokens=64, loss=float("nan") if nan else loss)
    if step % 10 == 0:
        temporary = ctl / f".step.{rank}"
        temporary.write_text(str(step))
        temporary.rename(ctl / f"step.{rank}")


def leave_or_freeze(fault: str) -> None:
    """The culprit's faults that end or freeze its process."""
    if fault == "exit":
        sys.exit(3)
    if fault in ("sigkill", "sigstop"):
        os.kill(os.getpid(), signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)


def main() -> None:
    args = parse()
    rank = int(os.environ["RANK"])
    (args.ctl / f"pid.{rank}").write_text(f"{os.getpid()}\n")
    dist.init_process_group(args.backend, timeout=datetime.timedelta(minutes=30))
    if args.parallel == "ddp":
        train_ddp(args, rank)
    else:
        from bench.faults import meshjob  # torch's mesh, FSDP and pipelining modules: only here
        meshjob.train(args, rank)
    dist.destroy_process_group()


def train_ddp(args: argparse.Namespace, rank: int) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256))
    on_gpu = args.backend == "nccl"
    if on_gpu:
        net = net.to("cuda", torch.bfloat16)
    model = DistributedDataParallel(net)
    matrices = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
                for _ in range(2)] if args.gpu else []
    if args.fault == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    culprit = rank == args.culprit
    go = args.ctl / "go"
    injected = False
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < args.duration:
        fault = args.fault if (injected or step >= fault_step(go)) else "none"
        if fault != "none" and not injected:
            injected = True
            if culprit or (fault == "checkpoint" and rank == 0) or fault == "loader-all":
                mark_onset(args.ctl, rank)
            if culprit:
                leave_or_freeze(fault)
            if fault == "checkpoint":
                if rank == 0:
                    save_checkpoint(net, args.ctl / "checkpoint.pt", args.pause)
                dist.barrier()
            if fault in ("desync-size", "desync-op"):
                if culprit and fault == "desync-op":
                    dist.broadcast(torch.zeros(64), src=rank)
                else:
                    dist.all_reduce(torch.zeros(72 if culprit else 64))
        if step == 0 and args.fault == "slow-start":
            if rank == 0:
                mark_onset(args.ctl, rank)
            time.sleep(args.pause if rank == 0 else args.pause / 3)  # "compiling"
        data = load_next_batch(step, rank, (culprit and fault == "loader") or
                               fault == "loader-all",
                               args.starve if fault == "starved" else 0.0)
        update_metrics(culprit and fault == "lock")
        # "Compute": a fixed time per step, not a pace to keep: a rank paced to its own clock
        # keeps whatever phase offset it started with (its peers wait for it at every step,
        # absorbed by their sleep), and a healthy job would read as having stragglers.
        seconds = args.step * (args.slow if culprit and fault == "straggler" else 1.0)
        if matrices:
            gpu_compute(seconds, matrices)
        else:
            time.sleep(seconds)
        if on_gpu:
            data = data.to("cuda", torch.bfloat16)
        loss = model(data).float().pow(2).mean()
        optimiser.zero_grad()
        loss.backward()  # DDP's all-reduce of the gradients
        optimiser.step()
        step += 1
        report_step(args.ctl, rank, step, loss.detach(), culprit and fault == "nan")


if __name__ == "__main__":
    main()
