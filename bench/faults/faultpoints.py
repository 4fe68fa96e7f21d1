"""Where a mesh job's culprit stops: named functions that never return, and the hooks that call
them once the fault is armed.

Each stop is its own function so that a stack (py-spy, the daemon's view of a stuck rank) says
where the rank stopped and why: before a tensor-parallel op, before FSDP's all-gather, inside
backward, inside a pipeline stage, before an expert-parallel all_to_all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.faults.trainer import NEVER

# The faults whose point this rank stops at (the culprit's, once on), each with what to do on
# getting there (write the onset: the rank stops there, a little after the fault was asked for).
ARMED: dict[str, Callable[[], None]] = {}


def arm(fault: str, on_reached: Callable[[], None]) -> None:
    ARMED[fault] = on_reached


def stuck_before_tp_op() -> None:
    NEVER.wait()


def stuck_before_all_gather() -> None:
    NEVER.wait()


def stuck_in_backward() -> None:
    NEVER.wait()


def stuck_in_stage_forward() -> None:
    NEVER.wait()


def stuck_in_stage_backward() -> None:
    NEVER.wait()


def stuck_before_all_to_all() -> None:
    NEVER.wait()


@dataclass(frozen=True)
class Point:
    """A fault (the trainer's --fault) and the function its culprit stops in."""

    fault: str
    stop: Callable[[], None]

    def reached(self) -> None:
        on_reached = ARMED.get(self.fault)
        if on_reached is not None:
            on_reached()
            self.stop()


TP_OP = Point("hang-tp", stuck_before_tp_op)
ALL_GATHER = Point("hang-fsdp", stuck_before_all_gather)
BACKWARD = Point("hang-backward", stuck_in_backward)
STAGE_FORWARD = Point("pp-forward", stuck_in_stage_forward)
STAGE_BACKWARD = Point("pp-backward", stuck_in_stage_backward)
ALL_TO_ALL = Point("hang-ep", stuck_before_all_to_all)


class _StopInBackward(torch.autograd.Function):
    """Identity forward; its backward stops (the autograd engine runs it on the CPU thread that
    called backward, so that thread's stack shows the stop)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, point: Point) -> torch.Tensor:
        ctx.point = point
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.point.reached()
        return grad, None


class Trap(torch.nn.Module):
    """An identity layer: its forward stops at `forward_point`, or the backward through it at
    `backward_point`, once that point's fault is armed."""

    def __init__(self, forward_point: Point | None = None,
                 backward_point: Point | None = None) -> None:
        super().__init__()
        self.forward_point, self.backward_point = forward_point, backward_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_point is not None:
            self.forward_point.reached()
        if self.backward_point is not None and self.backward_point.fault in ARMED:
            return _StopInBackward.apply(x, self.backward_point)
        return x
