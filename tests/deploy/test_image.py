"""The container image's policy, checked statically (no Docker engine runs here), and the
read-only-root promise checked for real: a running exporter opens nothing for writing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from tests.deploy.deploy_helpers import ROOT, wait_for_port
from tests.helpers import free_port, stop_process

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def resolved_images() -> list[str]:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M))
    images = []
    for stage in stages():
        image = stage[0][1].split()[0]
        images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
    return images


def test_multi_stage_with_pinned_bases():
    images = resolved_images()
    assert len(images) >= 2
    for image in images:
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and (re.search(r"\d", tag) or "@sha256:" in image
                                            or tag == "nonroot"), image
    assert images[-1].startswith("gcr.io/distroless/python3-debian12:")
    # the build stage's Python must be the runtime's: same Debian release, same minor version
    assert "debian:12" in images[0]
    assert "python3.11 -m venv /opt/llmmon" in DOCKERFILE.read_text()


def test_runtime_stage_is_shell_free_non_root_and_exec_form():
    final = dict((w, r) for w, r in stages()[-1])
    runtime = stages()[-1]
    assert not [r for w, r in runtime if w == "RUN"], "the distroless stage has no shell"
    assert not [r for w, r in runtime if w == "HEALTHCHECK"], "Kubernetes probes /healthz"
    user = final["USER"].split(":")
    assert all(part.isdigit() and int(part) > 0 for part in user), final["USER"]
    entrypoint = json.loads(final["ENTRYPOINT"])  # exec form: a JSON array, no /bin/sh -c
    assert entrypoint == ["/opt/llmmon/bin/llmmon"]
    assert json.loads(final["CMD"]) == ["serve"]
    assert "PYTHONDONTWRITEBYTECODE=1" in final["ENV"]
    assert final["EXPOSE"] == "9476"
    copies = [r for w, r in runtime if w == "COPY"]
    assert copies == ["--from=build /opt/llmmon /opt/llmmon"]


def test_image_and_ci_install_through_one_script():
    runs = " ".join(r for w, r in stages()[0] if w == "RUN")
    assert "PYTHON=/opt/llmmon/bin/python scripts/install.sh" in runs
    assert "compileall" in runs  # bytecode made at build time: nothing to write at run time
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bash scripts/install\.sh --test$", ci, re.M)
    out = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "install.sh")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--bogus"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr


def test_dockerignore_admits_exactly_what_is_copied():
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p and not p.startswith("#")]
    assert patterns[0] == "*"
    admitted = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for word, rest in stages()[0]:
        if word == "COPY" and not rest.startswith("--from"):
            copied.update(rest.split()[:-1])
    assert copied == admitted
    assert all((ROOT / path).exists() for path in copied)


WATCHER = textwrap.dedent("""
    import os, runpy, sys
    log = open(sys.argv[1], "w", buffering=1)  # opened before the hook: not counted
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            mode, flags = args[1] or "", args[2] or 0
            if any(c in mode for c in "wax+") or flags & WRITE:
                log.write(f"open {args[0]}\\n")
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink",
                       "os.link", "os.truncate", "os.chmod", "os.chown", "tempfile.mkstemp",
                       "tempfile.mkdtemp"):
            log.write(f"{event} {args[0]}\\n")
    sys.addaudithook(hook)
    sys.argv = ["llmmon", *sys.argv[2:]]
    runpy.run_module("llmmon", run_name="__main__")
""")


def test_running_exporter_writes_nothing(tmp_path: Path):
    """What `readOnlyRootFilesystem: true` needs: Python's audit hooks see every file the
    exporter opens for writing, from start through scrapes of every endpoint to shutdown."""
    port = free_port()
    writes, log = tmp_path / "writes.txt", tmp_path / "serve.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(writes), "serve",
             f"--web.listen-address=127.0.0.1:{port}"],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/nonexistent"})
    try:
        wait_for_port(port, process, log)
        for path in ("/metrics", "/healthz", "/api/v1/collectors", "/"):
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10,
                         headers={"Accept": "application/openmetrics-text",
                                  "Accept-Encoding": "gzip"}).status_code == 200
    finally:
        stop_process(process)
    assert writes.read_text() == "", f"the exporter wrote files:\n{writes.read_text()}"
