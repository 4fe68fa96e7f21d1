"""Starts the llmmon reporter at interpreter start; put on PYTHONPATH by `llmmon launch`.

This directory holds nothing but this hook, so it is all `llmmon launch` adds to the trainer's
path: the reporter package is loaded from its own directory (this one's parent) by location,
never by putting the daemon's site-packages on the trainer's path, where its packages would
shadow the trainer's own.  Python imports the first `sitecustomize` on sys.path, so this one
also runs the one it shadows (distributions and conda ship their own).  It never raises: a
broken reporter must not stop the training script from starting.
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

def _reporter():
    """The llmmon_reporter package beside this hook, imported under its own name."""
    if "llmmon_reporter" in sys.modules:
        return sys.modules["llmmon_reporter"]
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "llmmon_reporter", os.path.join(home, "__init__.py"), submodule_search_locations=[home])
    if spec is None or spec.loader is None:
        raise ImportError(f"no llmmon_reporter package in {home}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["llmmon_reporter"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["llmmon_reporter"]
        raise
    return module


try:
    _reporter().autostart()
except Exception as exc:
    sys.stderr.write(f"llmmon: reporter not started: {exc}\n")
