"""The import rules of docs/architecture.md hold on this checkout: `lint-imports` keeps every
contract of pyproject.toml, and no module of llmmon or llmmon_reporter is part of an import
cycle (a cycle makes import order matter and the two modules one unit in disguise)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import grimp

from tests.conftest import ROOT

PACKAGES = ("llmmon", "llmmon_reporter")


def test_graph_is_built_from_this_checkout() -> None:
    for name in PACKAGES:
        origin = Path(importlib.util.find_spec(name).origin).resolve()
        assert origin.is_relative_to(ROOT), f"{name} resolves to {origin}, not this checkout"


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint} is missing: pip install -e '.[test]' installs import-linter"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, f"an import contract is broken:\n{out.stdout}\n{out.stderr}"
    assert "0 broken" in out.stdout, out.stdout


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if graph.chain_exists(imported, module):
                cycles.append((module,) + graph.find_shortest_chain(imported, module))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
