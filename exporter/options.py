"""Typed options shared by the CLI flags and the YAML config file.

A collector declares its options once; the CLI turns each into a node_exporter-style flag
(`--collector.<name>.<option>`) and the config loader accepts the same key under
`collectors.<name>`, so flags, YAML and `--help` cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from `250ms`, `5s`, `1m`, `2h` or a bare number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 5s, 1m)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {value!r}")
    return seconds


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def parse_regex(value: Any) -> str:
    try:
        re.compile(str(value))
    except re.error as exc:
        raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    return str(value)


def parse_list(value: Any) -> tuple[str, ...]:
    """A YAML list, or a comma-separated string from the command line."""
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


def _positive_float(value: Any) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError(f"must be positive: {value!r}")
    return number


def _positive_int(value: Any) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(f"must be a positive whole number: {value!r}")
    return number


PARSERS: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": int,
    "positive_int": _positive_int,
    "float": float,
    "positive_float": _positive_float,
    "bool": parse_bool,
    "duration": parse_duration,
    "regex": parse_regex,
    "list": parse_list,
}


@dataclass(frozen=True)
class Option:
    """One setting: its key, type, default and help; `flag` overrides the generated flag name."""

    key: str
    type: str
    default: Any
    help: str
    flag: str | None = None

    def __post_init__(self) -> None:
        if self.type not in PARSERS:
            raise ValueError(f"option {self.key}: unknown type {self.type!r}")

    def parse(self, value: Any) -> Any:
        try:
            return PARSERS[self.type](value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
