"""A two-rank gloo job whose rank 1 waits in a receive that rank 0 never sends.

One process per rank:  python p2ptrainer.py --rank R --port P --out DIR [--after S]
Both ranks exchange a few messages (send 0->1, send 1->0) and all-reduce, then rank 1 posts one
more receive from rank 0, which rank 0 never sends (it sleeps).  After --after seconds a thread
in each rank writes torch's own pickled Flight Recorder dump to DIR/rank_R, as
ProcessGroupNCCL names its dump files.
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time

import torch
import torch.distributed as dist


def dump_later(out: str, rank: int, after: float) -> None:
    time.sleep(after)
    blob = torch._C._distributed_c10d._dump_fr_trace(  # type: ignore[attr-defined]
        includeCollectives=True, includeStackTraces=True, onlyActive=False)
    path = os.path.join(out, f"rank_{rank}")
    with open(path + ".tmp", "wb") as handle:
        handle.write(blob)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--after", type=float, default=5.0)
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=2, timeout=datetime.timedelta(seconds=600))
    threading.Thread(target=dump_later, args=(args.out, args.rank, args.after),
                     daemon=True).start()
    buf = torch.zeros(4)
    for _ in range(3):
        if args.rank == 0:
            dist.send(torch.ones(4), dst=1)
            dist.recv(buf, src=1)
        else:
            dist.recv(buf, src=0)
            dist.send(torch.ones(4), dst=0)
        dist.all_reduce(buf)
    if args.rank == 1:
        dist.recv(buf, src=0)  # never sent
    time.sleep(3600)


if __name__ == "__main__":
    main()
