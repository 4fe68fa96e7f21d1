"""The reporter runs inside training processes: importing it must pull in nothing of the daemon."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

DAEMON_ONLY = ("fastapi", "uvicorn", "pynvml", "pyroute2", "prometheus_client", "yaml",
               "starlette", "requests")


def imported_after(code: str) -> set[str]:
    probe = f"import sys, json; {code}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return set(json.loads(out))


def test_importing_the_reporter_loads_no_daemon_dependency_and_not_even_torch() -> None:
    modules = imported_after("import llmmon_reporter as reporter")
    assert "llmmon_reporter" in modules
    assert not {m.split(".")[0] for m in modules} & set(DAEMON_ONLY + ("torch",))


def test_starting_the_reporter_adds_nothing_of_the_daemon_to_what_torch_loads() -> None:
    baseline = imported_after("import torch.distributed")  # torch.cuda itself loads pynvml
    modules = imported_after("import torch.distributed; import llmmon_reporter as reporter; "
                             "reporter.start(); reporter.flush(1)")
    added = {m.split(".")[0] for m in modules - baseline}
    assert "llmmon_reporter" in added and "llmmon" not in added
    assert not added & set(DAEMON_ONLY)
