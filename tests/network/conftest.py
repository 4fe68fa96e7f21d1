"""Fixture trees for the network collectors, copied so a test can break them freely."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES


@pytest.fixture
def sys_tree(tmp_path: Path) -> Path:
    """A writable copy of tests/fixtures/sys (symlinks kept, as in real sysfs)."""
    tree = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sys", tree, symlinks=True)
    return tree


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    """A writable copy of the `ethtool -S` dumps."""
    tree = tmp_path / "ethtool"
    shutil.copytree(FIXTURES / "ethtool", tree)
    return tree
