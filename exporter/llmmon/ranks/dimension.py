"""Which parallelism a process group carries, in the user's words, from torch's own naming.

DeviceMesh describes each group it creates as `mesh_<dim>` (`mesh_tp`, `mesh_dp_shard`,
torchtitan's `mesh_dp_replicate`), the default group is `default_pg`; a group the job made itself
keeps the description it was given.  The dimension decides where a slow collective points: tensor
parallel belongs inside a node (NVLink), the other dimensions cross the network.
"""

from __future__ import annotations

import re

# dimension name -> the parallelism it carries, by the names torch, torchtitan and Megatron use
_KINDS = (
    (re.compile(r"^(tp|tensor|sp|seq|mp|model)"), "tensor"),
    (re.compile(r"^(pp|pipe|stage)"), "pipeline"),
    (re.compile(r"^(ep|expert|moe)"), "expert"),
    (re.compile(r"^(cp|context|ring)"), "context"),
    (re.compile(r"^(dp|data|fsdp|hsdp|shard|replicate|ddp)"), "data"),
)


def of(desc: str) -> str:
    """`tp` for `mesh_tp`, `world` for the default group, else the description itself."""
    if desc == "default_pg":
        return "world"
    return desc[len("mesh_"):] if desc.startswith("mesh_") else desc


def kind(dim: str) -> str:
    """tensor, pipeline, expert, context, data, world, or empty when the name says nothing."""
    if dim == "world":
        return "world"
    return next((name for pattern, name in _KINDS if pattern.match(dim.lower())), "")


def link(dim: str, local: bool) -> str:
    """What carries a slow collective of this dimension: for tensor parallel, the GPUs' own
    interconnect, or a group that should not span nodes; for the others, the network when the
    group spans nodes."""
    if kind(dim) == "tensor":
        return ("the interconnect between this node's GPUs (NVLink): tensor parallel runs there"
                if local else "the network between the nodes, under a tensor-parallel group "
                "that spans nodes (keep tensor parallel inside one node)")
    return ("the transport between this node's ranks" if local
            else "the network between the nodes")
