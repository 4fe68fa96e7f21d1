"""Every kind of collective the frameworks issue, once each, on a group named "1" that is not
the default: coalesced and bucketed all-reduces, functional collectives (DTensor's), the
all-gather, reduce-scatter and all-to-all forms FSDP2 and expert parallel use.

One process per rank:  python opstrainer.py --rank R --world 2 --port P --out DIR
It writes DIR/rank_R.json when done and holds for 600 s so the reporter keeps writing.
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

import llmmon_reporter


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--rank", "--world", "--port"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    llmmon_reporter.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=600))
    group = dist.new_group([0, 1], group_desc="ops")
    dist.all_reduce_coalesced([torch.ones(4), torch.ones(8)], group=group)
    with dist._coalescing_manager(group=group):
        dist.all_reduce(torch.ones(4), group=group)
        dist.all_reduce(torch.ones(4), group=group)
    funcol.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", group)[0].sum()
    funcol.all_gather_tensor(torch.ones(2), 0, group).sum()
    funcol.reduce_scatter_tensor(torch.ones(4), "sum", 0, group).sum()
    funcol.all_to_all_single(torch.ones(4), None, None, group).sum()
    dist.all_gather_into_tensor(torch.empty(8), torch.ones(4), group=group)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4), group=group)
    dist.all_to_all_single(torch.empty(4), torch.ones(4), group=group)
    path = os.path.join(args.out, f"rank_{args.rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump({"rank": args.rank}, handle)
    os.replace(path + ".tmp", path)
    time.sleep(600)


if __name__ == "__main__":
    main()
