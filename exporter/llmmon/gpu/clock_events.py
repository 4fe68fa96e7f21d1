"""Clock-event ("throttle") reason bitmasks decomposed into named 0/1 series.

Names follow nvidia-ml-py's `nvmlClocksEventReason*` constants.  A bit outside this table (a
newer driver's reason, or the deprecated BoardLimit/Reliability bits) is exported as
`bit_<n>` rather than dropped, so a new throttling cause is visible before we name it.
"""

from __future__ import annotations

REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
KNOWN_MASK = sum(REASONS)


def decompose(active: int, supported: int | None) -> list[tuple[str, int]]:
    """(reason, 0|1) for every supported bit and every active one, in bit order.

    Without a supported mask, the named reasons are reported."""
    mask = (KNOWN_MASK if supported is None else supported) | active
    return [(REASONS.get(1 << n, f"bit_{n}"), (active >> n) & 1)
            for n in range(mask.bit_length()) if mask >> n & 1]
