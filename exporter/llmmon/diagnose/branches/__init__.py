"""The branches of the decision tree, one module each, in the order an SRE walks them."""

from __future__ import annotations

from llmmon.diagnose.branches import (
    hang,
    health,
    memory,
    network,
    precision,
    starvation,
    thermal,
)
from llmmon.diagnose.tree import BranchSpec

TREE: tuple[BranchSpec, ...] = (precision.BRANCH, memory.BRANCH, starvation.BRANCH,
                                hang.BRANCH, thermal.BRANCH, network.BRANCH, health.BRANCH)
