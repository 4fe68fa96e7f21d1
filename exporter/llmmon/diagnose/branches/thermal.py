"""Thermal: is one card slower than its peers because it runs hot?

The clock-event reasons say so directly (software thermal slowdown near the slowdown
temperature, hardware thermal slowdown as the emergency brake); a busy card drawing far less
power than the other cards of its job says so indirectly.  Without rank information a card is
compared with the other busy cards of its node.
"""

from __future__ import annotations

from statistics import median

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Evidence, Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import BranchSpec, CheckSpec
from llmmon.diagnose.view import Sample, View, group, index, key

GPU_KEY = ("cluster", "node", "uuid")
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
JOB_POWER = "uuid_job_id:llmmon_gpu_power_watts:max"


def _gauge(view: View, name: str, selector: str) -> dict[tuple[str, ...], float]:
    return {k: s.value for k, s in index(view.instant(name, selector), *GPU_KEY).items()}


def clock_events(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_gpu_clock_event_active"):
        return unknown("no NVML GPUs reporting clock-event reasons")
    shares = view.mean_over_time("llmmon_gpu_clock_event_active", "5m",
                                 f'reason=~"{"|".join(THERMAL)}"')
    temperature = _gauge(view, "llmmon_gpu_temperature_celsius", 'sensor="gpu"')
    slowdown = _gauge(view, "llmmon_gpu_temperature_threshold_celsius", 'threshold="slowdown"')
    clock = _gauge(view, "llmmon_gpu_clock_hertz", 'clock="sm"')
    top = _gauge(view, "llmmon_gpu_clock_max_hertz", 'clock="sm"')
    found = []
    for gpu, reasons in sorted(group(shares, *GPU_KEY).items()):
        share = {s.get("reason"): s.value for s in reasons}
        hot = (share.get("hw_thermal_slowdown", 0) > 0
               or share.get("sw_thermal_slowdown", 0) > t.thermal_sw_fraction)
        if not hot:
            continue
        active = ", ".join(f"{reason} {d.percent(share[reason])} of the window"
                           for reason in THERMAL if share.get(reason, 0) > 0)
        facts = []
        if gpu in temperature:
            limit = f" (slowdown at {slowdown[gpu]:.0f} °C)" if gpu in slowdown else ""
            facts.append(f"{temperature[gpu]:.0f} °C{limit}")
        if gpu in clock and gpu in top:
            facts.append(f"SM clock {clock[gpu] / 1e6:.0f} of {top[gpu] / 1e6:.0f} MHz")
        found.append(d.evidence(reasons[0], d.GPU, f"{d.gpu(reasons[0])}: {active}"
                                f"{'; ' + ', '.join(facts) if facts else ''}",
                                **{f"{reason}_fraction": share.get(reason, 0.0)
                                   for reason in THERMAL}))
    if found:
        return suspect("a GPU slows its clocks because it runs too hot: check airflow, fans "
                       "and the card's heatsink; one slow card slows the whole job", *found)
    return ok("no GPU in thermal slowdown")


def _peer_groups(view: View, busy: dict[tuple[str, ...], float],
                 t: Thresholds) -> tuple[str, list[list[Sample]]]:
    """The GPUs to compare with each other: each job's, else each node's busy ones."""
    by_job = view.rule(JOB_POWER) or []
    if by_job:
        return "its job's GPUs", list(group(by_job, "cluster", "job_id").values())
    power = [s for s in view.instant("llmmon_gpu_power_watts")
             if busy.get(key(s, GPU_KEY), 0) > t.power_busy_utilization]
    return "the other busy GPUs of its node (no rank information)", list(
        group(power, "cluster", "node").values())


def power_peers(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_gpu_power_watts"):
        return unknown("no NVML GPUs reporting power")
    busy = _gauge(view, "llmmon_gpu_utilization_ratio", "")
    peers, groups = _peer_groups(view, busy, t)
    found: list[Evidence] = []
    compared = 0
    for members in groups:
        if len(members) < 2:
            continue
        compared += len(members)
        middle = median(s.value for s in members)
        for sample in members:
            utilization = busy.get(key(sample, GPU_KEY), 0.0)
            if (sample.value < t.power_peer_ratio * middle
                    and utilization > t.power_busy_utilization):
                job = f" of job {sample.get('job_id')}" if sample.get("job_id") else ""
                found.append(d.evidence(sample, d.GPU, f"{d.gpu(sample)}{job} draws "
                                        f"{sample.value:.0f} W against a median of {middle:.0f} W "
                                        f"while {d.percent(utilization)} busy",
                                        watts=sample.value, peer_median_watts=middle,
                                        utilization=utilization))
    if not compared:
        return unknown("fewer than two busy GPUs to compare")
    if found:
        return suspect(f"a busy GPU draws far less power than {peers}: it runs slower and the "
                       "job waits for it (look at its clock-event reasons and temperature)",
                       *found)
    return ok(f"every busy GPU draws power close to {peers}")


BRANCH = BranchSpec(
    "thermal", "Thermal throttling", "Is one card slower than its peers because it runs hot?",
    (CheckSpec("clock_events", "Thermal slowdown", clock_events, ("GPUThermalThrottle",),
               ("thermal_sw_fraction",)),
     CheckSpec("power_peers", "Power against peers", power_peers, ("GPUPowerBelowPeers",),
               ("power_peer_ratio", "power_busy_utilization"))))
