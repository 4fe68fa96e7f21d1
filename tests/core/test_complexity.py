"""No function of llmmon.ranks, llmmon.diagnose or llmmon.incidents is above cyclomatic
complexity 20, as radon measures it (`radon cc`): these rules judge hangs, ends and slowdowns
case by case, and a function with more paths than that has cases no one reads or tests one by one; split it into
named rules instead."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from radon.complexity import cc_visit
from radon.visitors import Class, Function

from tests.conftest import ROOT

LIMIT = 20
PACKAGES = tuple(ROOT / "exporter" / "llmmon" / name for name in ("ranks", "diagnose", "incidents"))
SOURCES = sorted(path for package in PACKAGES for path in package.rglob("*.py"))


def _functions(blocks: Iterable[Function | Class]) -> Iterator[Function]:
    """Every function among radon's blocks, closures and inner classes' methods included
    (`cc_visit` lists top-level functions and methods; a class block's own figure is its
    methods' mean, not a function's)."""
    for block in blocks:
        if isinstance(block, Class):
            for inner in block.inner_classes:
                yield from _functions([inner, *inner.methods])
        else:
            yield block
            yield from _functions(block.closures)


def test_the_packages_have_sources() -> None:
    for package in PACKAGES:
        assert any(path.parent == package for path in SOURCES), f"no module in {package}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_function_is_above_the_limit(path: Path) -> None:
    found = [f"{f.fullname} (line {f.lineno}): {f.complexity}"
             for f in _functions(cc_visit(path.read_text(encoding="utf-8")))
             if f.complexity > LIMIT]
    assert not found, (f"{path.relative_to(ROOT)}: above cyclomatic complexity {LIMIT}, split "
                       "into named rules:\n" + "\n".join(found))
