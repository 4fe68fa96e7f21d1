"""Scenario specs and the control file that switches them while the simulator runs.

A spec is `NAME[@NODE][:key=value,...]`, e.g. `hang`, `thermal@sim-01:gpu=3`,
`oom:ramp=60,oom=120`.  The control file holds one spec per line (`#` starts a comment; an
empty file means healthy).  The simulator re-reads it when it changes: scenarios that stay
listed keep running on their own clock, new ones start, removed ones stop.  A file that does
not parse is reported and ignored, so the running set never changes to something half-read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_SPEC = re.compile(r"^(?P<name>[a-z0-9-]+)(?:@(?P<node>[A-Za-z0-9_.-]+))?(?::(?P<params>.*))?$")


class SpecError(ValueError):
    """A spec or control file that does not parse, with what was wrong."""


@dataclass(frozen=True)
class Spec:
    name: str
    node: str | None
    params: tuple[tuple[str, float], ...]

    @property
    def text(self) -> str:
        node = f"@{self.node}" if self.node else ""
        params = ",".join(f"{k}={v:g}" for k, v in self.params)
        return f"{self.name}{node}{':' + params if params else ''}"


def parse(text: str) -> Spec:
    match = _SPEC.match(text.strip())
    if not match:
        raise SpecError(f"{text.strip()!r}: expected NAME[@NODE][:key=value,...]")
    params = []
    for item in filter(None, (match.group("params") or "").split(",")):
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            params.append((key.strip(), float(value)))
        except ValueError:
            raise SpecError(f"{text.strip()!r}: parameter {item!r} is not key=number") from None
    return Spec(match.group("name"), match.group("node"), tuple(params))


def parse_lines(text: str) -> list[Spec]:
    specs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            specs.append(parse(line))
        except SpecError as exc:
            raise SpecError(f"line {number}: {exc}") from None
    return specs


def write(path: Path, specs: list[Spec]) -> None:
    """Replace the control file atomically (a reader sees the old set or the new one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text("".join(f"{spec.text}\n" for spec in specs), encoding="utf-8")
    os.replace(temporary, path)


class ControlFile:
    """Hands out the file's specs whenever its content changed since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: str | None = None

    def changed(self) -> list[Spec] | None:
        """The new spec list, or None when the file is unchanged; SpecError if unreadable."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            raise SpecError(f"{self.path}: {exc.strerror or exc}") from None
        if text == self._seen:
            return None
        self._seen = text
        try:
            return parse_lines(text)
        except SpecError as exc:
            raise SpecError(f"{self.path}: {exc}") from None
