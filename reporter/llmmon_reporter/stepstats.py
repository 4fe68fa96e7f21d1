"""The optional step hook: step time, tokens, model FLOPs and non-finite losses, in O(1).

`step()` runs on the training thread, so it only does arithmetic.  A loss that is a CUDA
tensor is checked on the GPU and copied to pinned host memory asynchronously; the reporter
thread reads the host copy later, so nothing waits for the GPU.
"""

from __future__ import annotations

import bisect
import math
import time
from typing import Any

# Seconds between consecutive step() calls; LLM steps run from tens of ms to minutes.
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class StepStats:
    def __init__(self) -> None:
        self.steps = 0
        self.tokens = 0.0
        self.model_flops = 0.0
        self.nonfinite = 0
        self.seconds_sum = 0.0
        self.counts = [0] * (len(STEP_BUCKETS) + 1)
        self._last: float | None = None
        self._gpu_nonfinite: Any = None  # running count on the GPU
        self._host_nonfinite: Any = None  # pinned host copy, refreshed without a sync

    def step(self, tokens: float | None = None, loss: Any = None,
             model_flops: float | None = None) -> None:
        now = time.perf_counter()
        if self._last is not None:
            elapsed = now - self._last
            self.counts[bisect.bisect_left(STEP_BUCKETS, elapsed)] += 1
            self.seconds_sum += elapsed
        self._last = now
        self.steps += 1
        if tokens is not None:
            self.tokens += tokens
        if model_flops is not None:
            self.model_flops += model_flops
        if loss is not None:
            self._check_loss(loss)

    def _check_loss(self, loss: Any) -> None:
        if isinstance(loss, (int, float)):
            self.nonfinite += not math.isfinite(loss)
            return
        import torch  # a tensor was passed, so torch is already loaded

        finite = torch.isfinite(loss.detach())
        if loss.device.type == "cpu":
            self.nonfinite += not bool(finite.all())
            return
        if self._gpu_nonfinite is None:
            self._gpu_nonfinite = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._host_nonfinite = torch.zeros((), dtype=torch.int64, pin_memory=True)
        self._gpu_nonfinite += (~finite).any()
        self._host_nonfinite.copy_(self._gpu_nonfinite, non_blocking=True)

    def snapshot(self) -> dict[str, Any] | None:
        """The cumulative numbers for the spool file; None until step() was first called."""
        if not self.steps:
            return None
        gpu_nonfinite = int(self._host_nonfinite) if self._host_nonfinite is not None else 0
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "model_flops": self.model_flops,
            "loss_nonfinite": self.nonfinite + gpu_nonfinite,
            "seconds": {"buckets": list(STEP_BUCKETS), "counts": list(self.counts),
                        "sum": self.seconds_sum},
        }
