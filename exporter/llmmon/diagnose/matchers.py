"""PromQL label matchers (`netdev!~"lo|veth.*"`, `device=~"mlx5_[0-7]"`) evaluated in Python.

Selectors in alerts/config.yaml are written for PromQL; the local diagnosis applies the same
text to its own samples so both modes filter alike.  Regexes are anchored, as PromQL anchors them.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Mapping

_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')

Predicate = Callable[[Mapping[str, str]], bool]


def parse(selector: str) -> Predicate:
    """A predicate on label sets for a comma-separated list of matchers ('' matches all)."""
    tests: list[Predicate] = []
    position, text = 0, selector.strip()
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None:
            raise ValueError(f"label selector {selector!r}: cannot parse at {text[position:]!r}")
        name, op, raw, _ = match.groups()
        tests.append(_matcher(name, op, json.loads(f'"{raw}"')))
        position = match.end()
    return lambda labels: all(test(labels) for test in tests)


def _matcher(name: str, op: str, value: str) -> Predicate:
    if op in ("=~", "!~"):
        pattern = re.compile(f"(?:{value})")
        wanted = op == "=~"
        return lambda labels: bool(pattern.fullmatch(labels.get(name, ""))) == wanted
    return lambda labels: (labels.get(name, "") == value) == (op == "=")
