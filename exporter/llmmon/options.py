"""Typed options shared by the CLI flags and the YAML config file.

A collector declares its options once; the CLI turns each into a node_exporter-style flag
(`--collector.<name>.<option>`) and the config loader accepts the same key under
`collectors.<name>`, so flags, YAML and `--help` cannot disagree.  A numeric option declares
its range too: YAML happily yields `.inf`, `.nan` and `-1`, and an interval of a microsecond
or a rank bound of infinity would freeze or spin the daemon instead of failing at start-up.
"""

from __future__ import annotations

import math
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
    if not math.isfinite(seconds):  # YAML's .inf and .nan
        raise ValueError(f"not a finite duration: {value!r}")
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


def parse_int(value: Any) -> int:
    """A whole number: `8`, `"8"` or `8.0`; not `2.5`, not `.inf`, not `true`."""
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, float):
        if not value.is_integer():  # False for NaN and infinities too
            raise ValueError(f"not an integer: {value!r}")
        return int(value)
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"not an integer: {value!r}") from None


def parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"not a number: {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def format_duration(seconds: float) -> str:
    """The shortest exact spelling `parse_duration` reads back: 5.0 -> `5s`, 600 -> `10m`."""
    for unit in ("h", "m", "s", "ms"):
        count = seconds / _UNITS[unit]
        if count == int(count) and count >= 1:
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


PARSERS: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": parse_int,
    "float": parse_float,
    "bool": parse_bool,
    "duration": parse_duration,
    "regex": parse_regex,
    "list": parse_list,
}
# What --help shows for a value of each type; a `str` option names its own (PATH, ADDRESS ...).
METAVARS = {"int": "N", "float": "NUMBER", "bool": "BOOL",
            "duration": "DURATION", "regex": "REGEX", "list": "LIST"}


# Types whose options must declare `minimum` and `maximum` (written as the type's values).
BOUNDED = ("int", "float", "duration")


@dataclass(frozen=True)
class Option:
    """One setting: its key, type, default and help; `flag` overrides the generated flag name,
    `metavar` the type's placeholder in --help (required for `str`, which has none); numeric
    types declare the inclusive range of sane values; `choices` lists the values a list's items
    may take."""

    key: str
    type: str
    default: Any
    help: str
    flag: str | None = None
    metavar: str | None = None
    minimum: Any = None
    maximum: Any = None
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in PARSERS:
            raise ValueError(f"option {self.key}: unknown type {self.type!r}")
        if self.type in BOUNDED and (self.minimum is None or self.maximum is None):
            raise ValueError(f"option {self.key}: a {self.type} option declares its "
                             "minimum and maximum")
        if self.placeholder is None:
            raise ValueError(f"option {self.key}: a str option needs a metavar")
        self.parse(self.default)  # a default outside its own range is a declaration bug

    @property
    def placeholder(self) -> str | None:
        """The value's name in --help: DURATION, PATH, REGEX, N ..."""
        return self.metavar or METAVARS.get(self.type)

    def default_text(self) -> str:
        """The default as --help and docs/configuration.md print it: durations as `15s`,
        booleans as on/off, lists comma-separated, an empty value as `""`."""
        value = self.parse(self.default)
        if self.type == "duration":
            return format_duration(value)
        if self.type == "bool":
            return "on" if value else "off"
        if self.type == "list":
            value = ",".join(value)
        elif isinstance(value, float):
            value = f"{value:g}"
        return str(value) if str(value) else '""'

    @property
    def range(self) -> str:
        """`100ms to 24h`, or '' for an option without one (for --help and the docs)."""
        return f"{self.minimum} to {self.maximum}" if self.type in BOUNDED else ""

    def parse(self, value: Any) -> Any:
        parser = PARSERS[self.type]
        try:
            parsed = parser(value)
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"{value!r}: {exc}") from None
        if self.type in BOUNDED and not parser(self.minimum) <= parsed <= parser(self.maximum):
            raise ValueError(f"{value!r} is out of range: use {self.range}")
        unknown = [item for item in parsed if item not in self.choices] if self.choices else []
        if unknown:
            raise ValueError(f"unknown value(s) {', '.join(map(repr, unknown))}: use "
                             f"{', '.join(self.choices)}")
        return parsed
