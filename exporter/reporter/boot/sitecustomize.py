"""Starts the llmmon reporter at interpreter start; put on PYTHONPATH by `llmmon launch`.

Python imports the first `sitecustomize` on sys.path, so this one also runs the one it shadows
(distributions and conda ship their own).  It never raises: a broken reporter must not stop
the training script from starting.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _chain()
except Exception as exc:
    sys.stderr.write(f"llmmon: the shadowed sitecustomize failed: {exc}\n")

try:
    from exporter import reporter

    reporter.autostart()
except Exception as exc:
    sys.stderr.write(f"llmmon: reporter not started: {exc}\n")
