"""Fixtures for the diagnosis tests: real exporters over private copies of the fixture trees."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.diagnose.node import Node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """Make a Node over copies of the fixtures (override trees by keyword); stopped after."""
    made: list[Node] = []

    def make(**trees: Path | None) -> Node:
        built = Node(tmp_path / f"node{len(made)}", **trees)
        made.append(built)
        return built

    yield make
    for built in made:
        built.stop()
