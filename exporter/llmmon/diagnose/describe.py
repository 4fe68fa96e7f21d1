"""How evidence names things and numbers: GPU 4 on node a, 1.2 GB/s, 37 %, 3.2 s."""

from __future__ import annotations

from llmmon.diagnose.model import Evidence
from llmmon.diagnose.view import Sample

# Labels that say where a series comes from; Prometheus adds cluster and node at scrape time.
PLACE = ("cluster", "node")


def subject(sample: Sample, *labels: str) -> dict[str, str]:
    """The join labels of `sample` that name its object, plus its place when known."""
    return {label: sample.get(label) for label in (*labels, *PLACE) if sample.get(label)}


def on_node(sample: Sample) -> str:
    node = sample.get("node")
    return f" on node {node}" if node else ""


def node(sample: Sample) -> str:
    return f"node {sample.get('node')}" if sample.get("node") else "this node"


def gpu(sample: Sample) -> str:
    return f"GPU {sample.get('gpu') or '?'}{on_node(sample)}"


def rank(sample: Sample) -> str:
    return f"job {sample.get('job_id')} rank {sample.get('rank')}{on_node(sample)}"


def port(sample: Sample) -> str:
    return f"{sample.get('device')}/{sample.get('port')}{on_node(sample)}"


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f} %" if ratio >= 0.01 or ratio == 0 else f"{ratio * 100:.2f} %"


def size(count: float, unit: str = "B") -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= factor:
            return f"{count / factor:.3g} {prefix}{unit}"
    return f"{count:.3g} {unit}"


def seconds(value: float) -> str:
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.3g} s" if value >= 1 else f"{value * 1000:.3g} ms"


def evidence(sample: Sample, labels: tuple[str, ...], text: str,
             **values: float) -> Evidence:
    return Evidence(subject(sample, *labels), text, values)


GPU = ("gpu", "uuid")
RANK = ("job_id", "rank")
PORT = ("device", "port")
