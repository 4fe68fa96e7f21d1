"""The shipped recording rules (alerts/source/recording.yaml), computed over a local window.

With `--prometheus` the checks read these series as Prometheus recorded them; on a node they are
computed here from the same raw series with the same joins, so a check reads one name either way.
A test evaluates both on the same exporter and compares them.  Series carry the `by` labels of
their rule that exist locally (no `cluster` or `node`: a local window is one node).
"""

from __future__ import annotations

from statistics import median
from typing import Callable

from llmmon.diagnose.thresholds import Thresholds
from llmmon.diagnose.view import Sample, View, group, index, key, total

Rule = Callable[[View, Thresholds], "list[Sample] | None"]
RATE = "1m"  # the rules' ranges; a local window uses its own span


def _labels(labels: tuple[str, ...], values: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(labels, values))


def _ratio(numerator: list[Sample], denominator: list[Sample],
           *labels: str) -> list[Sample]:
    """sum by (labels) (numerator) / (sum by (labels) (denominator) > 0)."""
    tops = {k: total(s) for k, s in group(numerator, *labels).items()}
    bottoms = {k: total(s) for k, s in group(denominator, *labels).items()}
    return [Sample(_labels(labels, k), tops[k] / bottoms[k])
            for k in sorted(tops.keys() & bottoms.keys()) if bottoms[k] > 0]


def gpus_of_jobs(view: View, _: Thresholds) -> list[Sample]:
    """uuid_job_id:llmmon_rank_info:max_up: GPUs running an alive rank, by job."""
    alive = {key(s, ("job_id", "rank")) for s in view.instant("llmmon_rank_up") if s.value == 1}
    pairs = {key(s, ("uuid", "job_id")) for s in view.instant("llmmon_rank_info")
             if key(s, ("job_id", "rank")) in alive}
    return [Sample(_labels(("uuid", "job_id"), pair), 1.0) for pair in sorted(pairs)]


def mfu(view: View, thresholds: Thresholds) -> list[Sample] | None:
    """job_id:llmmon_training_mfu:ratio: model FLOP/s over the bf16 peak of the job's GPUs."""
    flops = view.rate("llmmon_training_model_flops_total", "5m")
    if flops is None:
        return None
    peaks = index(view.instant("llmmon_gpu_peak_flops", 'dtype="bf16"'), "uuid")
    capacity = [Sample({"job_id": s.get("job_id")}, peaks[(s.get("uuid"),)].value)
                for s in gpus_of_jobs(view, thresholds) if (s.get("uuid"),) in peaks]
    return _ratio(flops, capacity, "job_id")


def job_gpu_power(view: View, thresholds: Thresholds) -> list[Sample]:
    """uuid_job_id:llmmon_gpu_power_watts:max: power of each GPU of each job."""
    power = index(view.instant("llmmon_gpu_power_watts"), "uuid")
    found = []
    for pair in gpus_of_jobs(view, thresholds):
        sample = power.get((pair.get("uuid"),))
        if sample is not None:
            found.append(Sample({**pair.labels, "gpu": sample.get("gpu")}, sample.value))
    return found


def fragmentation(view: View, _: Thresholds) -> list[Sample]:
    """job_id_rank:llmmon_torch_memory_fragmentation:ratio: reserved memory holding no tensor."""
    allocated = index(view.instant("llmmon_torch_memory_allocated_bytes"), "job_id", "rank")
    found = []
    for reserved in view.instant("llmmon_torch_memory_reserved_bytes"):
        rank = key(reserved, ("job_id", "rank"))
        if reserved.value > 0 and rank in allocated:
            share = (reserved.value - allocated[rank].value) / reserved.value
            found.append(Sample(_labels(("job_id", "rank"), rank), share))
    return found


def reserved_share(view: View, _: Thresholds) -> list[Sample]:
    """job_id_rank:llmmon_torch_memory_reserved_per_gpu_memory:ratio: reserved / GPU memory."""
    gpu_of = {key(s, ("job_id", "rank")): s.get("uuid") for s in view.instant("llmmon_rank_info")}
    memory = view.instant("llmmon_gpu_memory_bytes", 'state="total"')
    sizes = {s.get("uuid"): s.value for s in memory if s.value > 0}
    found = []
    for reserved in view.instant("llmmon_torch_memory_reserved_bytes"):
        rank = key(reserved, ("job_id", "rank"))
        uuid = gpu_of.get(rank)
        if uuid in sizes:
            found.append(Sample({**_labels(("job_id", "rank"), rank), "uuid": uuid},
                                reserved.value / sizes[uuid]))
    return found


def _rate_ratio(view: View, numerator: str, denominator: str, labels: tuple[str, ...],
                window: str = RATE, selector: str = "") -> list[Sample] | None:
    """sum by (labels) (rate(numerator)) / (sum by (labels) (rate(denominator)) > 0)."""
    top = view.rate(numerator, window, selector)
    bottom = view.rate(denominator, window, selector)
    if top is None or bottom is None:
        return None
    return _ratio(top, bottom, *labels)


def busbw(view: View, _: Thresholds) -> list[Sample] | None:
    """job_id_pg:llmmon_nccl_busbw_bytes_per_second:rate1m: bus bytes per second in collectives."""
    return _rate_ratio(view, "llmmon_nccl_bus_bytes_total",
                       "llmmon_nccl_collective_duration_seconds_sum", ("job_id", "pg"))


def mean_collective_seconds(view: View, thresholds: Thresholds) -> list[Sample] | None:
    """job_id_rank_pg:llmmon_nccl_collective_duration_seconds:mean10m (symmetric collectives)."""
    return _rate_ratio(view, "llmmon_nccl_collective_duration_seconds_sum",
                       "llmmon_nccl_collective_duration_seconds_count", ("job_id", "rank", "pg"),
                       "10m", f'coll=~"{thresholds.straggler_collectives}"')


def straggler_score(view: View, thresholds: Thresholds) -> list[Sample] | None:
    """job_id_rank:llmmon_nccl_straggler_score:ratio: how much less a rank waits than the
    median rank of its group, the largest over its groups."""
    means = mean_collective_seconds(view, thresholds)
    if means is None:
        return None
    scores: dict[tuple[str, ...], float] = {}
    for members in group(means, "job_id", "pg").values():
        middle = median(s.value for s in members)
        if middle <= 0:
            continue
        for sample in members:
            rank = key(sample, ("job_id", "rank"))
            scores[rank] = max(scores.get(rank, float("-inf")), (middle - sample.value) / middle)
    return [Sample(_labels(("job_id", "rank"), rank), score)
            for rank, score in sorted(scores.items())]


def _rate_of(name: str, window: str = RATE) -> Rule:
    def rule(view: View, _: Thresholds) -> list[Sample] | None:
        return view.rate(name, window)
    return rule


def read_latency(view: View, _: Thresholds) -> list[Sample] | None:
    """node_device:llmmon_disk_read_latency_seconds:rate1m: seconds per completed read."""
    return _rate_ratio(view, "llmmon_disk_read_seconds_total", "llmmon_disk_reads_total",
                       ("device",))


LOSS_COUNTERS = (("out_of_sequence", "llmmon_rdma_out_of_sequence_total"),
                 ("packet_seq_errors", "llmmon_rdma_packet_seq_errors_total"),
                 ("local_ack_timeouts", "llmmon_rdma_local_ack_timeouts_total"),
                 ("implied_nak_seq_errors", "llmmon_rdma_implied_nak_seq_errors_total"),
                 ("roce_adp_retransmits", "llmmon_rdma_roce_adp_retransmits_total"))


def rdma_loss(view: View, _: Thresholds) -> list[Sample] | None:
    """node_device_port:llmmon_rdma_loss_events:rate5m: loss events per second, by counter."""
    found = []
    for counter, name in LOSS_COUNTERS:
        rates = view.rate(name, "5m")
        if rates is None:
            return None
        found += [Sample({**s.labels, "counter": counter}, s.value) for s in rates]
    return found


RULES: dict[str, Rule] = {
    "uuid_job_id:llmmon_rank_info:max_up": gpus_of_jobs,
    "job_id:llmmon_training_mfu:ratio": mfu,
    "uuid_job_id:llmmon_gpu_power_watts:max": job_gpu_power,
    "job_id_rank:llmmon_torch_memory_fragmentation:ratio": fragmentation,
    "job_id_rank:llmmon_torch_memory_reserved_per_gpu_memory:ratio": reserved_share,
    "job_id_pg:llmmon_nccl_busbw_bytes_per_second:rate1m": busbw,
    "job_id_rank_pg:llmmon_nccl_collective_duration_seconds:mean10m": mean_collective_seconds,
    "job_id_rank:llmmon_nccl_straggler_score:ratio": straggler_score,
    "node_device:llmmon_disk_read_latency_seconds:rate1m": read_latency,
    "node_device:llmmon_disk_reads:rate1m": _rate_of("llmmon_disk_reads_total"),
    "node_device:llmmon_disk_read_bytes:rate1m": _rate_of("llmmon_disk_read_bytes_total"),
    "node:llmmon_pressure_io_stalled_seconds:rate1m":
        _rate_of("llmmon_pressure_io_stalled_seconds_total"),
    "node_netdev_priority:llmmon_nic_pfc_pause:ratio_rate1m":
        _rate_of("llmmon_nic_pfc_pause_seconds_total"),
    "node_device_port:llmmon_rdma_loss_events:rate5m": rdma_loss,
}
