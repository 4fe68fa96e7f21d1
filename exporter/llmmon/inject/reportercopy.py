"""What the injected init container runs: the reporter package, copied into the pod's emptyDir.

The reporter needs nothing but the standard library (and torch, which the trainer has), so a
copy of its source is all a trainer image needs: no pip, no matching Python build. The copy is
world-readable whatever user the trainer runs as, and holds no bytecode (the trainer's Python
writes its own, or none on a read-only mount).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import llmmon_reporter

PACKAGE = Path(llmmon_reporter.__file__).resolve().parent


def copy_reporter(dest: str | os.PathLike[str]) -> Path:
    """`dest`/llmmon_reporter, replaced whole if there (an init container may run again);
    returns the boot directory to put first on PYTHONPATH."""
    target = Path(dest) / PACKAGE.name
    staging = Path(dest) / f".{PACKAGE.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(PACKAGE, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                    copy_function=shutil.copyfile)
    for root, dirs, files in os.walk(staging):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target / "boot"
