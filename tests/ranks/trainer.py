"""A small gloo training job for the reporter tests: real model, real collectives, real reporter.

One process per rank:  python trainer.py --rank R --world W --port P --out DIR [options]
It writes DIR/rank_R.json (checksum of the trained weights, the reporter's health, the
Flight Recorder environment it saw), then keeps running for --hold seconds so the reporter
keeps writing.  Behaviours: healthy, hang (the culprit stops issuing collectives), straggler
(the culprit sleeps before each collective), exit (the culprit leaves early); and, at a given
step, a crash (the culprit raises), an exit (the culprit calls sys.exit(3)), a desync (the
culprit broadcasts where its peers all-reduce, or all-reduces another size), a data loader
that never returns (the culprit sleeps in `load_next_batch`), a freeze (the culprit stops
itself between collectives, or inside one) or a checkpoint (rank 0 writes with torch.save while
the others wait).  --culprit-unwatched: the culprit runs no reporter, as a rank on another node
would (its daemon, not this one, sees it).  --overlap: an asynchronous all-reduce in flight with
the gradients' (gloo then completes out of order).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

ENV_SEEN = ("LLMMON_JOB", "LLMMON_SPOOL", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
            "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
            "LLMMON_REPORTER_PID")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)))
    parser.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    parser.add_argument("--port", type=int, default=0, help="0: use MASTER_ADDR/PORT (torchrun)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reporter", choices=("explicit", "auto", "off"), default="explicit")
    parser.add_argument("--behaviour", choices=("healthy", "hang", "straggler", "exit"),
                        default="healthy")
    parser.add_argument("--culprit", type=int, default=-1)
    parser.add_argument("--compute", type=float, default=0.0, help="seconds of 'compute' a step")
    parser.add_argument("--sleep", type=float, default=0.0,
                        help="straggler delay before each all_reduce")
    parser.add_argument("--nan-at", type=int, default=-1, help="report a NaN loss at this step")
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--wait-disabled", type=float, default=0.0,
                        help="after training, wait this long for the reporter to disable itself")
    parser.add_argument("--timeout", type=float, default=120.0, help="gloo timeout")
    parser.add_argument("--crash-at", type=int, default=-1, help="the culprit raises here")
    parser.add_argument("--exit-at", type=int, default=-1,
                        help="the culprit calls sys.exit(3) here")
    parser.add_argument("--desync-at", type=int, default=-1,
                        help="the culprit broadcasts where its peers all-reduce, here")
    parser.add_argument("--desync-by", choices=("op", "size"), default="op",
                        help="size: the culprit all-reduces 72 floats where its peers "
                             "all-reduce 64 (gloo aborts the rank that receives them)")
    parser.add_argument("--culprit-spool", default="",
                        help="the culprit reports into this spool (as a rank of another node)")
    parser.add_argument("--culprit-unwatched", action="store_true",
                        help="the culprit runs no reporter (as a rank of another node)")
    parser.add_argument("--stuck-at", type=int, default=-1,
                        help="the culprit's data loader never returns from this step on")
    parser.add_argument("--freeze-at", type=int, default=-1,
                        help="the culprit stops itself (SIGSTOP) between collectives here")
    parser.add_argument("--freeze-inside-at", type=int, default=-1,
                        help="the culprit stops itself (SIGSTOP) inside an all-reduce here, "
                             "which its peers enter once it is stopped")
    parser.add_argument("--ckpt-at", type=int, default=-1, help="rank 0 checkpoints here")
    parser.add_argument("--ckpt-seconds", type=float, default=0.0)
    parser.add_argument("--ckpt-until", default="",
                        help="the checkpoint ends once this file exists (within --ckpt-seconds)")
    parser.add_argument("--overlap", type=int, default=0,
                        help="each step, all-reduce this many floats asynchronously while the "
                             "gradients' all-reduces run (DDP's overlapped buckets)")
    return parser.parse_args()


def load_next_batch(seconds: float) -> None:
    """A data loader that never returns (for `seconds`): sleeping, no CPU."""
    time.sleep(seconds)


def save_checkpoint(model: torch.nn.Module, path: str, seconds: float, until: str = "") -> None:
    """A slow checkpoint: torch.save of a 16 MB state over and over for `seconds`, or until the
    file `until` exists (the test has seen what it waited for)."""
    state = {"weights": torch.randn(4 << 20), "model": model.state_dict()}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until and os.path.exists(until)):
        with open(path, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())


def flush_retired(reporter: object, timeout: float = 60.0) -> None:
    """Flush the reporter once gloo has retired every record of the ring (a moment after the
    last collective returns; at most `timeout` seconds, each wait): the flushes see the last
    collective done, as later ticks would.  The bound is long because a rank that exits next
    (`--behaviour exit`) loses a flush cut short; with 10 s bounds a CI run under a CPU hog once
    saw such a rank's last two collectives unreported.  Two flushes: when gloo's two threads
    finish the last collectives out of order its completed number stays one behind, and the
    reporter counts the last one done only when two ring reads in a row agree
    (llmmon_reporter/settle.py); one flush is one read, and a CI run under a CPU hog saw an
    exiting rank's last collective reported unfinished (9 of 10)."""
    dump = torch._C._distributed_c10d._dump_fr_trace_json
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(
            e.get("retired") for e in json.loads(dump()).get("entries", ())):
        time.sleep(0.01)
    if reporter is not None:
        for _ in range(2):
            reporter.flush(timeout)  # type: ignore[attr-defined]


def freeze(reporter: object) -> None:
    """SIGSTOP this process between steps, after its reporter wrote the last collective done:
    a stop from outside at a random moment can catch a collective in flight, and the group then
    waits in it (another verdict, also right: tests/slow/ranks/test_quiet_job.py wants this one)."""
    flush_retired(reporter)
    os.kill(os.getpid(), signal.SIGSTOP)


def freeze_inside(reporter: object, culprit: int, out: str) -> None:
    """SIGSTOP this process inside an all-reduce, after its reporter wrote it in flight: the
    peers enter it only once this process is stopped (`enter_after_stop`), so it cannot
    complete first."""
    dist.all_reduce(torch.zeros(64), async_op=True)
    reporter.flush()  # type: ignore[attr-defined]
    with open(os.path.join(out, f"frozen.{culprit}"), "w") as pid:
        pid.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)


def enter_after_stop(culprit: int, out: str) -> None:
    """The culprit's freeze_inside: wait until its process is stopped, then all-reduce."""
    path = os.path.join(out, f"frozen.{culprit}")
    while True:
        try:
            with open(path) as pid, open(f"/proc/{pid.read()}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("t", "T"):
                    break
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    dist.all_reduce(torch.zeros(64))


def main() -> None:
    args = parse()
    reporter = None
    culprit = args.rank == args.culprit
    if args.reporter != "off" and not (culprit and args.culprit_unwatched):
        import llmmon_reporter as reporter  # type: ignore[no-redef]
        if args.reporter == "explicit":
            reporter.start(args.culprit_spool if culprit and args.culprit_spool else None)
    init = f"tcp://127.0.0.1:{args.port}" if args.port else "env://"
    dist.init_process_group("gloo", init_method=init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    pair = dist.new_group([0, 1], group_desc="pair") if args.world > 1 else None
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if step == args.steps // 2 and (args.behaviour == "exit" or
                                        (culprit and args.behaviour == "hang")):
            break  # hang: the culprit never issues this step's collectives; exit: all stop
        if culprit and step == args.crash_at:
            raise RuntimeError(f"rank {args.rank} crashed at step {step}")
        if culprit and step == args.exit_at:
            sys.exit(3)
        if culprit and step == args.stuck_at:
            load_next_batch(args.hold)
        if culprit and step == args.freeze_at:
            freeze(reporter)
        if step == args.freeze_inside_at:
            if culprit:
                freeze_inside(reporter, args.rank, args.out)
            else:
                enter_after_stop(args.culprit, args.out)
        if step == args.desync_at:  # the same sequence number, another collective
            if culprit and args.desync_by == "op":
                dist.broadcast(torch.zeros(64), src=args.rank)
            else:
                dist.all_reduce(torch.zeros(72 if culprit else 64))
        if args.rank == 0 and step == args.ckpt_at:
            save_checkpoint(model, os.path.join(args.out, "ckpt.pt"), args.ckpt_seconds,
                            args.ckpt_until)
        data = torch.randn(32, 64, generator=torch.Generator().manual_seed(step * 100 + args.rank))
        loss = model(data).pow(2).mean()
        time.sleep(args.compute)
        optimiser.zero_grad()
        loss.backward()
        bucket = dist.all_reduce(torch.ones(args.overlap), async_op=True) if args.overlap \
            else None
        for param in model.parameters():
            if culprit and args.behaviour == "straggler":
                time.sleep(args.sleep)  # late to every collective
            grad = param.grad.to(torch.bfloat16)
            dist.all_reduce(grad)
            param.grad.copy_(grad / args.world)
        if bucket is not None:
            bucket.wait()
        if pair is not None and args.rank in (0, 1):
            gathered = torch.empty(2 * 16)
            dist.all_gather_into_tensor(gathered, torch.full((16,), float(step)), group=pair)
        optimiser.step()
        if reporter is not None:
            reported = float("nan") if step == args.nan_at else loss.detach()
            reporter.step(tokens=32, loss=reported, model_flops=6 * 64 * 64 * 32)
    health: dict = {}
    if reporter is not None:
        flush_retired(reporter)
        deadline = time.monotonic() + args.wait_disabled
        while time.monotonic() < deadline and not reporter.health().get("disabled"):
            time.sleep(0.05)
        health = reporter.health()
    result = {"rank": args.rank, "pid": os.getpid(),
              "checksum": float(sum(p.detach().double().sum() for p in model.parameters())),
              "health": health, "env": {k: os.environ.get(k) for k in ENV_SEEN}}
    path = os.path.join(args.out, f"rank_{args.rank}.json")
    with open(path + ".tmp", "w") as handle:  # renamed whole: the test polls for the name
        json.dump(result, handle)
    os.replace(path + ".tmp", path)
    if culprit and args.behaviour == "exit":
        os._exit(0)  # gone without a goodbye, as a crashed rank would be
    time.sleep(args.hold)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
