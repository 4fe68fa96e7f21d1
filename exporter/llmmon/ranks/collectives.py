"""Bytes and bus bytes of Flight Recorder collectives, by nccl-tests' rules.

nccl-tests (doc/PERFORMANCE.md; NCCL Inspector uses the same factors) defines, for a group of
n ranks and a message of S bytes, algbw = S / t and busbw = algbw * factor, where S is the
input of reductions and all-to-all, the total output of gathers, and factor is 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, and 1 otherwise.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

# c10 ScalarType names, as the Flight Recorder writes them, and their element sizes.
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "ComplexHalf": 4, "ComplexFloat": 8,
    "ComplexDouble": 16, "Bool": 1, "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8,
    "UInt16": 2, "UInt32": 4, "UInt64": 8, "QInt8": 1, "QUInt8": 1, "QInt32": 4,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1,
}


_FAMILIES = (("allreduce", "all_reduce"), ("allgather", "all_gather"),
             ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"))


@functools.lru_cache(maxsize=256)
def family(coll: str) -> str:
    """all_reduce, all_gather, reduce_scatter, all_to_all or other, from a profiling name."""
    flat = coll.replace("_", "")
    return next((name for key, name in _FAMILIES if key in flat), "other")


@functools.lru_cache(maxsize=256)
def coll_name(profiling_name: str) -> str:
    """`nccl:_all_gather_base` -> `_all_gather_base`: the backend prefix is not the operation,
    nor are the group ranks of a point-to-point record (`nccl:recv 1<-0` -> `recv`), which
    would make a `coll` label value per pair."""
    return profiling_name.rpartition(":")[2].split(" ", 1)[0].lower()


def bus_factor(coll: str, group_size: int) -> float:
    n = group_size
    kind = family(coll)
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def payload(coll: str, inputs: tuple[Sequence[Sequence[int]], Sequence[str]],
            outputs: tuple[Sequence[Sequence[int]], Sequence[str]]) -> tuple[int | None, str]:
    """S in bytes (None when a dtype is unknown) and the dtype label ("mixed" if several)."""
    sizes, dtypes = outputs if family(coll) == "all_gather" or not inputs[0] else inputs
    if not dtypes:
        return None, "unknown"
    if len(dtypes) == 1 and len(sizes) > 1:
        dtypes = list(dtypes) * len(sizes)
    label = dtypes[0] if len(set(dtypes)) == 1 else "mixed"
    if len(dtypes) != len(sizes) or any(d not in DTYPE_BYTES for d in dtypes):
        return None, label
    return sum(math.prod(shape) * DTYPE_BYTES[d] for shape, d in zip(sizes, dtypes)), label
