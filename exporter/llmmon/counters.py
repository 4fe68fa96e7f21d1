"""The range a counter reading can hold: what sources and the renderer both refuse beyond it.

Kernel and hardware counters are unsigned 64-bit; a file holding a negative count or a number
past 2^64 is corrupt (or hostile), and Prometheus' float64 could not hold it exactly anyway.
"""

from __future__ import annotations

COUNTER_MAX = 2 ** 64


def check_count(value: int) -> int:
    """`value` if it can be a counter's reading, else ValueError naming the range."""
    if not 0 <= value <= COUNTER_MAX:
        raise ValueError("outside a counter's range (0 to 2^64)")
    return value
