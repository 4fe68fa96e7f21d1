"""The counters of one node that stand out against the job's other nodes during the stall.

A hang across nodes often has one node whose link or GPU misbehaved while the others only
waited.  Its network and GPU counters rose during the stall far more than the same counters on
the other nodes.  The rule is deliberately simple, so a reader can check it by hand: a node's
delta over the stall is an outlier when it reaches the metric's absolute floor (a handful of
retransmits is normal) and is more than RATIO times the median of the other nodes' deltas.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

RATIO = 10.0
# (pattern over the exported metric name, the delta below which nothing is said)
FLOORS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"retransmit"), 100.0),
    (re.compile(r"out_of_sequence"), 100.0),
    (re.compile(r"_cnp_"), 1000.0),
    (re.compile(r"pause_(frames|transitions)"), 1000.0),
    (re.compile(r"pause_seconds|throttle_seconds"), 1.0),
    (re.compile(r"pause_storm|xid_errors"), 1.0),
)
XIDS = "xid"  # gpus.json's xids list, summed over the node's GPUs


@dataclass(frozen=True)
class Outlier:
    node: str
    metric: str
    during: float  # the node's delta over the stall (summed over its ports or GPUs)
    before: float | None  # the same over the span before it
    others_median: float
    floor: float
    text: str


def floor_of(metric: str) -> float | None:
    """The metric's floor; None: a counter the rule does not judge (bytes, packets...)."""
    if metric == XIDS:
        return 1.0
    return next((floor for pattern, floor in FLOORS if pattern.search(metric)), None)


def node_deltas(network: Mapping[str, Any] | None, gpus: Mapping[str, Any] | None
                ) -> dict[str, tuple[float, float | None]]:
    """metric -> (delta during, delta before), summed over the node's ports and GPUs; only
    metrics the rule judges, only where a delta during the stall was read."""
    sums: dict[str, list[float | None]] = {}
    items: list[Any] = []
    items += [p.get("counters") for p in _list(network, "ports")]
    items += [g.get("values") for g in _list(gpus, "gpus")]
    for counters in items:
        for metric, span in (counters.items() if isinstance(counters, dict) else ()):
            if floor_of(metric) is None or not isinstance(span, dict):
                continue
            during, before = _num(span.get("during")), _num(span.get("before"))
            if during is None:
                continue
            total = sums.setdefault(metric, [0.0, None])
            total[0] = (total[0] or 0.0) + during
            if before is not None:  # the ports that read one
                total[1] = (total[1] or 0.0) + before
    xids = [x.get("count") for g in _list(gpus, "gpus") for x in _list(g, "xids")]
    if any(_num(c) is not None for c in xids):
        sums[XIDS] = [sum(_num(c) or 0.0 for c in xids), None]
    return {m: (float(v[0] or 0.0), v[1]) for m, v in sums.items()}


def outliers(deltas: Mapping[str, Mapping[str, tuple[float, float | None]]]) -> list[Outlier]:
    """node -> node_deltas: every (node, metric) far above the other nodes.  A metric read on
    one node only is not judged: there is nothing to compare it with."""
    found = []
    metrics = sorted({m for values in deltas.values() for m in values})
    for metric in metrics:
        floor = floor_of(metric)
        if floor is None:
            continue
        for node, values in sorted(deltas.items()):
            if metric not in values:
                continue
            others = [v[metric][0] for n, v in deltas.items() if n != node and metric in v]
            if not others:
                continue
            during, before = values[metric]
            median = statistics.median(others)
            if during >= floor and during > RATIO * median:
                was = "" if before is None else f", {_n(before)} before it"
                them = "the other node's" if len(others) == 1 else \
                    f"the median of the {len(others)} other nodes'"
                text = (f"{node}: {metric} rose by {_n(during)} during the stall{was}; "
                        f"{them} {_n(median)}")
                found.append(Outlier(node, metric, during, before, median, floor, text))
    return found


def _list(doc: Any, key: str) -> Iterable[dict[str, Any]]:
    value = doc.get(key) if isinstance(doc, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return float(value) if ok and abs(value) != float("inf") else None


def _n(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.3g}"
