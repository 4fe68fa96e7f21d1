"""Rank lists as text: `0-3,7` for label values and JSON, `0–3, 7` for people."""

from __future__ import annotations

from typing import Iterable, Sequence

from llmmon_reporter.flight import ranges


def join_spans(spans: Iterable[Sequence[int]], dash: str = "-") -> str:
    """[[0, 3], [7, 7]] -> '0-3,7' (ASCII, for label values and JSON)."""
    return ",".join(f"{a}" if a == b else f"{a}{dash}{b}" for a, b in spans)


def spans_text(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 7] -> '0–3, 7' (for people)."""
    return join_spans(ranges(sorted(ranks)), "–").replace(",", ", ")
