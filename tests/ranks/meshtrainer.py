"""A gloo job over a 2-D DeviceMesh for the reporter tests: the collectives FSDP2 and tensor
parallel issue, on groups whose Flight Recorder ids differ from their names on every rank.

One process per rank:  python meshtrainer.py --rank R --world W --port P --out DIR [options]
Each step: a functional all-reduce over "tp" (DTensor's), then an all-gather and a
reduce-scatter over "dp" (FSDP2's).  `--stuck-at S --culprit R`: rank R sleeps in
`stuck_forever` at step S before its tp all-reduce.  It writes DIR/rank_R.json (the groups as
torch names them) after its last step, then holds for --hold seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

import llmmon_reporter


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dp", type=int, default=2, help="the mesh's first dimension")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compute", type=float, default=0.0)
    parser.add_argument("--culprit", type=int, default=-1)
    parser.add_argument("--stuck-at", type=int, default=-1)
    parser.add_argument("--hold", type=float, default=0.0)
    return parser.parse_args()


def stuck_forever() -> None:
    """The culprit's Python never returns from here: no CPU, no collective."""
    while True:
        time.sleep(3600)


def groups() -> dict[str, dict[str, object]]:
    """name -> description and members of every group this rank is in, as torch has them."""
    world = dist.distributed_c10d._world
    return {str(name): {"desc": pg.group_desc, "ranks": sorted(world.pg_group_ranks[pg])}
            for pg, name in world.pg_names.items()}


def main() -> None:
    args = parse()
    llmmon_reporter.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (args.dp, args.world // args.dp), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    shard = torch.ones(8)
    for step in range(args.steps):
        if args.rank == args.culprit and step == args.stuck_at:
            stuck_forever()
        activations = funcol.all_reduce(torch.ones(16), "sum", (mesh, 1))
        activations = activations + 0  # waits on it, as DTensor does
        full = torch.empty(8 * dp.size())
        dist.all_gather_into_tensor(full, shard, group=dp)
        dist.reduce_scatter_tensor(shard, full, group=dp)
        shard /= dp.size()
        time.sleep(args.compute)
        llmmon_reporter.step(tokens=16)
    path = os.path.join(args.out, f"rank_{args.rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump({"rank": args.rank, "groups": groups(), "tp": dist.get_process_group_ranks(tp),
                   "dp": dist.get_process_group_ranks(dp)}, handle)
    os.replace(path + ".tmp", path)
    time.sleep(args.hold)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
