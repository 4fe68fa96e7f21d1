"""A virtual environment that holds torch and nothing else: a trainer's image without llmmon.

A venv without pip whose site-packages links torch, the distributions torch requires and numpy
(from this interpreter's installation, resolved from their metadata), and nothing else: the fault
benchmark's jobs without the reporter, and the tests that prove the reporter needs nothing of
the daemon's environment, run there.
"""

from __future__ import annotations

import re
import sysconfig
import venv
from importlib import metadata
from pathlib import Path


def _requirements(name: str, seen: set[str]) -> None:
    """The distributions `name` needs on this interpreter, recursively (markers evaluated)."""
    from packaging.requirements import Requirement

    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    seen.add(key)
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            try:
                metadata.distribution(requirement.name)
            except metadata.PackageNotFoundError:
                continue  # optional on this platform and not installed: torch runs without it
            _requirements(requirement.name, seen)


def _top_level(name: str) -> set[str]:
    """The importable top-level names a distribution installs (packages and modules)."""
    tops = set()
    for file in metadata.distribution(name).files or []:
        first = file.parts[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__"):
            continue
        tops.add(first)
    return tops


# Not in torch's requirements, but in every image that trains with it: pipelining sends its
# stage metadata as pickled objects through numpy (`tensor.numpy()`).
ALONGSIDE = ("numpy",)


def torch_only_venv(where: Path) -> Path:
    """A venv whose site-packages has torch, what torch requires and numpy (when this
    interpreter has it); returns its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(where),
                                                       "platbase": str(where)}))
    needed: set[str] = set()
    _requirements("torch", needed)
    for name in ALONGSIDE:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        _requirements(name, needed)
    source = Path(sysconfig.get_path("purelib"))
    for dist in needed:
        for top in _top_level(dist):
            if (source / top).exists() and not (purelib / top).exists():
                (purelib / top).symlink_to(source / top)
    return where / "bin" / "python"
