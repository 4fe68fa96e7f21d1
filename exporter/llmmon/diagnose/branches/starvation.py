"""Starvation: do the GPUs wait for input data?

A starved GPU swings between its busy level and idle several times a second: the 20 Hz instant
power shows dips and time below the low level that the 1 s average hides.  Model FLOPs
utilisation below 30 % says the same from the job's side; slow disk reads and IO pressure say
why.  Each GPU is judged on its own (the alert averages the GPUs of a job on a node).
"""

from __future__ import annotations

from llmmon.diagnose import describe as d
from llmmon.diagnose.model import Evidence, Outcome, ok, suspect, unknown
from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.tree import NEEDS_RATES, BranchSpec, CheckSpec
from llmmon.diagnose.view import View, group, index, key, total

GPU_KEY = ("cluster", "node", "uuid")
JOB_GPUS = "uuid_job_id:llmmon_rank_info:max_up"
MFU = "job_id:llmmon_training_mfu:ratio"
READ_LATENCY = "node_device:llmmon_disk_read_latency_seconds:rate1m"
READS = "node_device:llmmon_disk_reads:rate1m"
READ_BYTES = "node_device:llmmon_disk_read_bytes:rate1m"
PRESSURE = "node:llmmon_pressure_io_stalled_seconds:rate1m"


def jobs_by_gpu(view: View) -> dict[tuple[str, ...], list[str]]:
    """(cluster, node, uuid) -> the jobs with an alive rank on that GPU."""
    return {gpu: sorted(s.get("job_id") for s in members)
            for gpu, members in group(view.rule(JOB_GPUS) or [], *GPU_KEY).items()}


def power_dips(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_gpu_power_low_seconds_total"):
        return unknown("no instant-power sampling (no NVML GPUs, or their power limit is "
                       "unknown)")
    low = view.rate("llmmon_gpu_power_low_seconds_total", "5m")
    dips = index(view.rate("llmmon_gpu_power_dips_total", "5m") or [], *GPU_KEY)
    if low is None:
        return unknown(NEEDS_RATES)
    jobs = jobs_by_gpu(view)
    rows = []
    for sample in low:
        gpu = key(sample, GPU_KEY)
        per_minute = dips[gpu].value * 60 if gpu in dips else 0.0
        names = jobs.get(gpu)
        owner = f" (job {', '.join(names)})" if names else ""
        item = d.evidence(sample, d.GPU, f"{d.gpu(sample)}{owner}: below the low-power level "
                          f"{d.percent(sample.value)} of the time, {per_minute:.1f} dips a minute",
                          low_power_fraction=sample.value, dips_per_minute=per_minute)
        starved = (sample.value > t.starvation_low_power_fraction
                   and per_minute > t.starvation_dips_per_minute)
        rows.append((starved, per_minute, item))
    bad = [item for starved, _, item in rows if starved]
    if bad:
        return suspect("GPU power dips repeatedly to idle: the input pipeline starves the GPUs "
                       "(more data-loader workers and prefetch, faster storage)", *bad)
    busiest = sorted(rows, key=lambda row: -row[1])[:1]
    return ok("no GPU dips repeatedly", *(item for _, _, item in busiest))


def mfu(view: View, t: Thresholds) -> Outcome:
    values = view.rule(MFU)
    if values is None:
        return unknown(NEEDS_RATES)
    if not values:
        return unknown("no job reports model FLOPs (reporter.step(model_flops=...)) on GPUs "
                       "with a known peak")
    steps = {k: total(s) for k, s in group(view.rate("llmmon_training_steps_total", "5m") or [],
                                           "cluster", "job_id").items()}
    low, fine, idle = [], [], []
    for sample in values:
        text = f"job {sample.get('job_id')}: MFU {d.percent(sample.value)}"
        if steps.get(key(sample, ("cluster", "job_id")), 0) <= 0:
            idle.append(d.evidence(sample, ("job_id",), f"{text}, no step in the window "
                                   "(not judged)", mfu=sample.value))
        else:
            (low if sample.value < t.mfu_low else fine).append(
                d.evidence(sample, ("job_id",), text, mfu=sample.value))
    if low:
        return suspect("the job uses its GPUs' compute poorly while making progress; walk the "
                       "tree: power dips, one card low, a late rank, collective bandwidth", *low)
    if fine:
        return ok("model FLOPs utilisation is above the failing line", *fine, *idle)
    return unknown("no job made a step in the window", *idle)


def disk_reads(view: View, t: Thresholds) -> Outcome:
    if not view.instant("llmmon_disk_reads_total"):
        return unknown("no block devices in /proc/diskstats")
    latency = view.rule(READ_LATENCY)
    if latency is None:
        return unknown(NEEDS_RATES)
    place = ("cluster", "node", "device")
    reads = index(view.rule(READS) or [], *place)
    volume = index(view.rule(READ_BYTES) or [], *place)
    rows = []
    for sample in sorted(latency, key=lambda s: -s.value):
        where = key(sample, place)
        iops = reads[where].value if where in reads else 0.0
        rate = volume[where].value if where in volume else 0.0
        item = d.evidence(sample, ("device",), f"{sample.get('device')}{d.on_node(sample)}: reads "
                          f"take {d.seconds(sample.value)} at {iops:.3g} reads/s "
                          f"({d.size(rate, 'B/s')})", read_latency_seconds=sample.value,
                          reads_per_second=iops, read_bytes_per_second=rate)
        rows.append((sample.value > t.disk_read_latency_seconds
                     and iops > t.disk_min_reads_per_second, item))
    pressure = _pressure(view)
    bad = [item for saturated, item in rows if saturated]
    if bad:
        return suspect("a disk cannot keep up with the reads asked of it", *bad, *pressure)
    if not rows:
        return ok("no disk served reads in the window", *pressure)
    slowest = rows[0][1]
    return ok(f"the slowest disk answers reads in "
              f"{d.seconds(slowest.values['read_latency_seconds'])}", slowest, *pressure)


def _pressure(view: View) -> tuple[Evidence, ...]:
    """IO pressure per node: context for the disk verdict (no alert judges it)."""
    found = []
    for stalls in group(view.rule(PRESSURE) or [], "cluster", "node").values():
        stalls.sort(key=lambda s: s.get("kind"))
        text = ", ".join(f"{s.get('kind')} {d.percent(s.value)}" for s in stalls)
        found.append(Evidence(d.subject(stalls[0]), f"IO pressure{d.on_node(stalls[0])}: tasks "
                              f"stalled on IO {text} of the time",
                              {f"io_stalled_{s.get('kind')}": s.value for s in stalls}))
    return tuple(found)


BRANCH = BranchSpec(
    "starvation", "Input starvation", "Do the GPUs wait for input data?",
    (CheckSpec("power_dips", "Power dips", power_dips, ("GPUDataLoaderStarvation",),
               ("starvation_low_power_fraction", "starvation_dips_per_minute")),
     CheckSpec("mfu", "Model FLOPs utilisation", mfu, ("LLMTrainingMFULow",), ("mfu_low",)),
     CheckSpec("disk_reads", "Disk reads", disk_reads, ("DiskReadSaturated",),
               ("disk_read_latency_seconds", "disk_min_reads_per_second"))))
