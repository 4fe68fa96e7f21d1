"""The fault benchmark's mesh jobs: the trainer's step loop over a 2x2 DeviceMesh (4 ranks, gloo).

    torchrun --nproc-per-node 4 -m bench.faults.trainer --ctl CTL --parallel fsdp-tp

Real jobs run several process groups at once, whose names (counted over every group the job
creates) differ from the ids each rank gives its own; these jobs make the daemon read them:

  fsdp-tp  mesh (dp, tp): an MLP, Colwise/RowwiseParallel over tp, fully_shard over dp
  hsdp     mesh (replicate, shard): fully_shard over both dims
  pp       mesh (dp, pp): two pipeline stages (ScheduleGPipe, 4 microbatches, send/recv over
           pp), gradients all-reduced over dp
  ep       mesh (dp, ep): a top-1 mixture of experts whose tokens go to their expert's rank and
           back by all_to_all_single over ep (bench/faults/moe.py); expert gradients all-reduced
           over dp, the others over the world

Each step is the DDP trainer's: a data-loader call, `--step` s of "compute", forward and
backward, the optimiser, `reporter.step()`.  Faults with a point (bench/faults/faultpoints.py)
stop the culprit there and write its onset when it gets there:

  hang-tp        before the row-wise layer's forward, whose output is all-reduced over tp (fsdp-tp)
  hang-fsdp      before the model call whose pre-forward all-gathers the shards (fsdp-tp, hsdp)
  hang-backward  inside backward, between the two layers (fsdp-tp)
  pp-forward     inside its stage's forward (pp)
  pp-backward    inside its stage's backward (pp)
  hang-ep        before the MoE layer's first all_to_all (ep)

and of the trainer's own: loader, loader-all, exit, sigkill, sigstop, straggler, starved, nan.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from bench.faults import faultpoints as fp
from bench.faults.moe import MoE
from bench.faults.trainer import (fault_step, leave_or_freeze, load_next_batch, mark_onset,
                                  report_step)

DIM = 256
BATCH = 64
MICROBATCHES = 4
TRAINER_FAULTS = ("none", "loader", "loader-all", "exit", "sigkill", "sigstop", "straggler",
                  "starved", "nan")
# DTensor's local outputs are views, and FSDP warns of in-place ops on them once per module
# class and rank: these models do none.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


@dataclass
class MeshJob:
    """One rank's part of a mesh job."""

    data_rank: int  # the batch this rank trains on: ranks that split one model share it
    parameters: list[torch.nn.Parameter]
    # Forward, backward and gradient sync of a batch; the loss where this rank computes one.
    step: Callable[[torch.Tensor], torch.Tensor | None]


def mlp(*layers: torch.nn.Module) -> torch.nn.Sequential:
    """Linear, ReLU, `layers`, Linear: the same weights on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.ReLU(), *layers,
                               torch.nn.Linear(DIM, DIM))


def forward_backward(model: torch.nn.Module, data: torch.Tensor) -> torch.Tensor:
    fp.ALL_GATHER.reached()  # the model's pre-forward all-gathers the shards
    loss = model(data).pow(2).mean()
    loss.backward()
    return loss.detach()


def shard_layers(model: torch.nn.Sequential, mesh: DeviceMesh) -> None:
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def before_tp_op(module: torch.nn.Module, args: tuple[object, ...]) -> None:
    fp.TP_OP.reached()


def fsdp_tp() -> MeshJob:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = mlp(fp.Trap(backward_point=fp.BACKWARD))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "3": RowwiseParallel()})
    shard_layers(model, mesh["dp"])
    model[3].register_forward_pre_hook(before_tp_op)  # last: after FSDP's unshard, TP's input
    return MeshJob(mesh["dp"].get_local_rank(), list(model.parameters()),
                   partial(forward_backward, model))


def hsdp() -> MeshJob:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = mlp()
    shard_layers(model, mesh)
    return MeshJob(mesh.get_rank(), list(model.parameters()), partial(forward_backward, model))


def all_reduce_mean(parameters: list[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=group)
            parameter.grad /= group.size()


def pp() -> MeshJob:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    stage_index = mesh["pp"].get_local_rank()
    model = mlp(fp.Trap(fp.STAGE_FORWARD, fp.STAGE_BACKWARD))
    part = model[:3] if stage_index == 0 else model[2:]  # the trap in each stage
    stage = PipelineStage(part, stage_index, 2, torch.device("cpu"),
                          group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=lambda out, target:
                             (out - target).pow(2).mean())
    dp_group = mesh["dp"].get_group()

    def step(data: torch.Tensor) -> torch.Tensor | None:
        if stage_index == 0:
            schedule.step(data)
            loss = None
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=torch.zeros_like(data), losses=losses)
            loss = torch.stack(losses).mean().detach()
        all_reduce_mean(list(part.parameters()), dp_group)
        return loss

    return MeshJob(mesh["dp"].get_local_rank(), list(part.parameters()), step)


def ep() -> MeshJob:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.ReLU(),
                                MoE(DIM, 2, mesh["ep"].get_group()))
    experts = list(model[2].experts.parameters())
    shared = [p for p in model.parameters() if all(p is not e for e in experts)]
    dp_group = mesh["dp"].get_group()

    def step(data: torch.Tensor) -> torch.Tensor:
        loss = model(data).pow(2).mean()
        loss.backward()
        all_reduce_mean(shared, dist.group.WORLD)
        all_reduce_mean(experts, dp_group)
        return loss.detach()

    return MeshJob(mesh.get_rank(), list(model.parameters()), step)


MODES: dict[str, tuple[Callable[[], MeshJob], tuple[str, ...]]] = {
    "fsdp-tp": (fsdp_tp, (fp.TP_OP.fault, fp.ALL_GATHER.fault, fp.BACKWARD.fault)),
    "hsdp": (hsdp, (fp.ALL_GATHER.fault,)),
    "pp": (pp, (fp.STAGE_FORWARD.fault, fp.STAGE_BACKWARD.fault)),
    "ep": (ep, (fp.ALL_TO_ALL.fault,)),
}


def train(args: argparse.Namespace, rank: int) -> None:
    """The trainer's step loop (bench/faults/trainer.py) over the mesh job `args.parallel`."""
    build, points = MODES[args.parallel]
    if args.fault not in (*TRAINER_FAULTS, *points):
        raise SystemExit(f"--parallel {args.parallel} has no fault {args.fault!r}; it has "
                         f"{', '.join((*TRAINER_FAULTS, *points))}")
    job = build()
    optimiser = torch.optim.SGD(job.parameters, lr=0.01)
    culprit = rank == args.culprit
    go: Path = args.ctl / "go"
    injected = False
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < args.duration:
        fault = args.fault if (injected or step >= fault_step(go)) else "none"
        if fault != "none" and not injected:
            injected = True
            if culprit and fault in points:
                fp.arm(fault, partial(mark_onset, args.ctl, rank))
            elif culprit or fault == "loader-all":
                mark_onset(args.ctl, rank)
            if culprit:
                leave_or_freeze(fault)
        data = load_next_batch(step, job.data_rank, (culprit and fault == "loader") or
                               fault == "loader-all",
                               args.starve if fault == "starved" else 0.0)
        time.sleep(args.step * (args.slow if culprit and fault == "straggler" else 1.0))
        optimiser.zero_grad()
        loss = job.step(data)
        optimiser.step()
        step += 1
        report_step(args.ctl, rank, step, loss, culprit and fault == "nan")
