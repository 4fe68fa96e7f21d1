"""The trainer side cannot collide with the trainer: its own packages win, nothing of the daemon's
environment reaches it, and the reporter runs where only torch is installed.

The environments are real virtual environments. "Only torch" is a venv without pip whose
site-packages holds torch and the distributions torch requires, and nothing else
(bench/faults/torchvenv.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bench.faults.torchvenv import torch_only_venv
from tests.conftest import ROOT, SOURCES
from tests.ranks.jobs import FAST, base_env

DAEMON_ONLY = ("llmmon", "fastapi", "uvicorn", "starlette", "requests", "yaml", "pyroute2",
               "prometheus_client", "bcrypt", "pynvml")


def run_python(python: Path, code: str, env: dict[str, str], cwd: Path) -> dict:
    done = subprocess.run([str(python), "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean_env(**extra: str) -> dict[str, str]:
    env = base_env(**extra)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def torch_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return torch_only_venv(tmp_path_factory.mktemp("torch-only") / "venv")


def test_the_torch_only_environment_really_has_only_torch(torch_only: Path, tmp_path: Path):
    """The premise of the tests below: the daemon's dependencies are not importable there."""
    found = run_python(torch_only, "import importlib.util, json, torch; print(json.dumps("
                       f"[m for m in {list(DAEMON_ONLY)!r} if importlib.util.find_spec(m)]))",
                       clean_env(), tmp_path)
    assert found == []


def test_the_reporter_distribution_installs_and_reports_where_only_torch_is(
        torch_only: Path, tmp_path: Path):
    """reporter/ builds as `llmmon-reporter` with no requirement, and its thread writes a rank's
    spool files in a one-rank gloo job with nothing but torch beside it."""
    source = tmp_path / "src"
    shutil.copytree(ROOT / "reporter", source, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # pip without this checkout on PYTHONPATH: there it would find the editable install's
    # metadata beside reporter/ and call the reporter installed in the venv already.
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                   check=True, capture_output=True, timeout=300, env=clean_env())
    (wheel,) = wheels.glob("llmmon_reporter-*.whl")
    subprocess.run(pip + ["--python", str(torch_only), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=clean_env())
    spool = tmp_path / "spool"
    spool.mkdir()
    probe = """
import importlib.metadata as md, importlib.util, json, datetime
import llmmon_reporter as reporter
import torch.distributed as dist
reporter.start()
dist.init_process_group("gloo", init_method="file://%s", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
import torch
for _ in range(3):
    dist.all_reduce(torch.ones(4))
    reporter.step(tokens=4)
flushed = reporter.flush(30)
print(json.dumps({"flushed": flushed, "health": reporter.health(),
                  "requires": md.requires("llmmon-reporter"),
                  "daemon": [m for m in %r if importlib.util.find_spec(m)]}))
reporter.stop()
dist.destroy_process_group()
""" % (tmp_path / "store", DAEMON_ONLY)
    seen = run_python(torch_only, probe, clean_env(LLMMON_SPOOL=str(spool), LLMMON_JOB="solo",
                                                   RANK="0", **FAST), tmp_path)
    assert seen["requires"] is None  # no dependency at all, torch included
    assert seen["daemon"] == []
    assert seen["flushed"] and seen["health"]["running"], seen["health"]
    assert list((spool / "solo").glob("rank_0.*.json")), list(spool.rglob("*"))

TRAINER = """
import datetime, importlib.util, json, os, sys
import torch, torch.distributed as dist
import exporter, fastapi, requests
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
for _ in range(5):
    dist.all_reduce(torch.ones(8))
reporter = sys.modules.get("llmmon_reporter")
flushed = reporter.flush(30) if reporter else False
out = {"exporter": exporter.OWNER, "fastapi": fastapi.__version__,
       "requests": requests.__version__, "flushed": flushed,
       "reporter_file": getattr(reporter, "__file__", None),
       "health": reporter.health() if reporter else None,
       "daemon": [m for m in DAEMON if importlib.util.find_spec(m)],
       "path": sys.path, "pythonpath": os.environ.get("PYTHONPATH", "")}
open(os.path.join(sys.argv[1], f"rank_{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def test_a_trainer_with_its_own_exporter_requests_and_fastapi_imports_its_own_under_launch(
        tmp_path: Path):
    """llmmon lives in this interpreter's environment; the trainer in its own venv, with its
    own `exporter` package and its own pinned `requests` and `fastapi`. Under `llmmon launch`
    the trainer imports its own, sees nothing of llmmon's environment, and still reports."""
    torch_only = torch_only_venv(tmp_path / "trainer-venv")
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(torch_only.parents[1]),
                                                       "platbase": str(torch_only.parents[1])}))
    for name, version in (("requests", "2.0.0+trainer"), ("fastapi", "0.1.0+trainer")):
        (purelib / name).mkdir()
        (purelib / name / "__init__.py").write_text(f"__version__ = {version!r}\n")
    project = tmp_path / "project"
    (project / "exporter").mkdir(parents=True)
    (project / "exporter" / "__init__.py").write_text("OWNER = 'the trainer'\n")
    others = tuple(m for m in DAEMON_ONLY if m not in ("requests", "fastapi"))
    (project / "train.py").write_text(f"DAEMON = {others!r}\n" + TRAINER)
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    out.mkdir()
    # The launcher runs from this checkout without putting it on the environment's PYTHONPATH
    # (which launch would pass on to the trainer, as it does with any path the user set).
    launcher = [sys.executable, "-c", f"import sys; sys.path[:0] = {SOURCES!r}; "
                "from llmmon.cli import main; sys.exit(main())"]
    command = launcher + ["launch", "--job", "isolated", "--spool", str(spool),
                          "--fr-dir", str(tmp_path / "fr"), "--pipe-dir", str(tmp_path / "pipe"),
                          "--", str(torch_only), "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "train.py", str(out)]
    done = subprocess.run(command, env=clean_env(**FAST), cwd=project, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    boot = (ROOT / "reporter" / "llmmon_reporter" / "boot").resolve()
    for rank in (0, 1):
        seen = json.loads((out / f"rank_{rank}.json").read_text())
        assert (seen["exporter"], seen["requests"], seen["fastapi"]) == \
            ("the trainer", "2.0.0+trainer", "0.1.0+trainer")
        assert seen["daemon"] == []  # neither llmmon nor any package of its environment
        added = seen["pythonpath"].split(os.pathsep)
        assert len(added) == 1 and Path(added[0]).resolve() == boot, added
        assert sorted(p.name for p in boot.iterdir() if p.name != "__pycache__") == \
            ["sitecustomize.py"]
        assert seen["health"] and seen["health"]["running"] and seen["flushed"], seen["health"]
    assert len(list((spool / "isolated").glob("rank_*.json"))) >= 2
