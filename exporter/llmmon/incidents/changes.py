"""What changed on the node when the stall began: the GPUs' values and the ports' counters
before and during it (gpus.json, network.json), the largest changes marked."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmmon.incidents.html import as_dict, as_list, esc, number, table

TABLE_ROWS = 200  # rows of one GPU or network table
HIGHLIGHTED = 3  # rows marked as the ones that changed most


@dataclass(frozen=True)
class Change:
    """One counter or gauge before and during the stall, for a table row."""

    cells: list[str]
    before: Any
    during: Any
    score: float


def _change(cells: list[str], pair: Any, spans: tuple[float, float] | None,
            counter: bool) -> Change:
    pair = as_dict(pair)
    before, during = pair.get("before"), pair.get("during")
    return Change(cells, before, during, _score(before, during, spans, counter))


def _score(before: Any, during: Any, spans: tuple[float, float] | None, counter: bool) -> float:
    """How much it changed: relative, per second for counters over spans of different length."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, during)):
        return 0.0
    if counter and spans:
        before, during = before / spans[0], during / spans[1]
    return abs(during - before) / max(abs(before), 1.0)


def _spans(document: dict[str, Any]) -> tuple[float, float] | None:
    spans = as_dict(document.get("spans"))
    try:
        (b0, b1), (d0, d1) = spans["before"], spans["during"]
        lengths = (float(b1) - float(b0), float(d1) - float(d0))
    except (KeyError, TypeError, ValueError):
        return None
    return lengths if min(lengths) > 0 else None


def _changes_table(head: list[str], changes: list[Change], spans: tuple[float, float] | None
                   ) -> str:
    if not changes:
        return "<p class='muted'>no values</p>"
    scores = sorted((c.score for c in changes if c.score > 0), reverse=True)[:HIGHLIGHTED]
    least = scores[-1] if scores else math.inf
    top = [c for c in changes if c.score >= least]  # the HIGHLIGHTED first, and their ties
    shown = changes[:TABLE_ROWS]
    rows = [c.cells + [number(c.before), number(c.during)] for c in shown]
    span_words = (f"before: the {spans[0]:.0f} s before onset; during: the {spans[1]:.0f} s "
                  "after; counters are increases over each span, gauges means") if spans else ""
    most = "".join(f"<li>{' '.join(c.cells)}: {number(c.before)} → {number(c.during)}</li>"
                   for c in top)
    return ((f"<p>Changed most:</p><ul>{most}</ul>" if most else "")
            + (f"<p class='muted'>{esc(span_words)}</p>" if span_words else "")
            + table(head + ["before", "during"], rows,
                    ["hl" if c.score >= least else "" for c in shown])
            + (f"<p class='muted'>{len(changes) - len(shown)} rows more in the file</p>"
               if len(changes) > len(shown) else ""))


def gpus(value: Any) -> str:
    """gpus.json: XID errors, the GPUs, and their values before and during."""
    document = as_dict(value)
    spans = _spans(document)
    found, xids, names = [], [], []
    for gpu in map(as_dict, as_list(document.get("gpus"))):
        label, uuid = esc(gpu.get("gpu", "?")), esc(gpu.get("uuid", ""))
        names.append(f"<li>GPU {label}: {esc(gpu.get('name', ''))} {uuid}</li>")
        found += [_change([f"GPU {label}", esc(metric)], pair, spans, metric.endswith("_total"))
                  for metric, pair in sorted(as_dict(gpu.get("values")).items())]
        xids += [f"GPU {label} ({uuid}): XID {esc(xid.get('xid'))} ×{esc(xid.get('count'))}"
                 for xid in map(as_dict, as_list(gpu.get("xids")))]
    return ((f"<p class='bad'>{'<br>'.join(xids)}</p>" if xids else "<p>no XID error</p>")
            + (f"<ul>{''.join(names)}</ul>" if names else "")
            + _changes_table(["gpu", "metric"], found, spans))


def network(value: Any) -> str:
    """network.json: each port's counters before and during."""
    document = as_dict(value)
    spans = _spans(document)
    found = []
    for port in map(as_dict, as_list(document.get("ports"))):
        where = " ".join(str(port.get(k) or "") for k in ("kind", "device", "port", "netdev"))
        found += [_change([esc(where.strip()), esc(metric)], pair, spans, True)
                  for metric, pair in sorted(as_dict(port.get("counters")).items())]
    return _changes_table(["port", "counter"], found, spans)


