"""A tiny mixture-of-experts layer with expert parallelism, for the fault benchmark's ep job.

Each rank of the ep group holds `per_rank` experts; a token goes to the rank of its top-1
expert and back, both ways by `all_to_all_single` over the group (the counts first, as real
MoE layers exchange them), so every forward and backward waits on every peer in the group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

from bench.faults import faultpoints as fp


class MoE(torch.nn.Module):
    def __init__(self, dim: int, per_rank: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group, self.per_rank = group, per_rank
        self.gate = torch.nn.Linear(dim, per_rank * group.size())  # the caller's seed: shared
        torch.manual_seed(1000 + group.rank())  # this rank's own experts
        self.experts = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fp.ALL_TO_ALL.reached()
        weight, expert = self.gate(x).softmax(-1).max(-1)
        order = expert.argsort()
        send_counts = torch.bincount(expert[order] // self.per_rank, minlength=self.group.size())
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        sent, received = send_counts.tolist(), recv_counts.tolist()
        local = torch.empty(sum(received), dtype=torch.long)
        dist.all_to_all_single(local, expert[order] % self.per_rank, received, sent,
                               group=self.group)
        tokens = all_to_all_single_autograd(x[order], received, sent, self.group)
        out = sum(torch.where((local == e)[:, None], layer(tokens), 0.0)
                  for e, layer in enumerate(self.experts))
        back = all_to_all_single_autograd(out, sent, received, self.group)
        return torch.zeros_like(x).index_copy(0, order, back) * weight[:, None]
