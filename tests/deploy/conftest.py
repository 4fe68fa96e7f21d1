"""Fixtures for the deployment tests: certificates made with openssl, live exporters."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest
import yaml

from tests.deploy.deploy_helpers import ROOT, Certs, Exporter, ca, issue, wait_for_port
from tests.helpers import free_port, stop_process


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Made here with the openssl binary, valid for two days, never committed."""
    d = tmp_path_factory.mktemp("certs")
    ca(d, "ca")
    ca(d, "stranger-ca")
    issue(d, "server", "ca", "/CN=llmmon",
           "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:llmmon\n"
           "extendedKeyUsage=serverAuth\n")
    issue(d, "client", "ca", "/CN=prometheus", "extendedKeyUsage=clientAuth\n")
    issue(d, "stranger", "stranger-ca", "/CN=stranger", "extendedKeyUsage=clientAuth\n")
    return Certs(d, d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt",
                 d / "client.key", d / "stranger.crt", d / "stranger.key")


@pytest.fixture
def web_serve(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    """Start `llmmon serve` (disk collector only: it works on any Linux, plus `flags`) with a
    web config."""
    started: list[subprocess.Popen] = []

    def start(web_config: Path | None = None, port: int | None = None,
              flags: Sequence[str] = ()) -> Exporter:
        port = port or free_port()
        config = {"web": {"listen_address": f"127.0.0.1:{port}"}}
        if web_config is not None:
            config["web"]["config_file"] = str(web_config)
        path = tmp_path / f"llmmon-{port}.yml"
        path.write_text(yaml.safe_dump(config))
        log = tmp_path / f"llmmon-{port}.log"
        with open(log, "wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "llmmon", "serve", f"--config.file={path}",
                 "--collector.disable-defaults", "--collector.disk", *flags],
                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        started.append(process)
        wait_for_port(port, process, log)
        return Exporter(port, process)

    yield start
    for process in started:
        stop_process(process)


@pytest.fixture
def workdir(certs: Certs, tmp_path: Path) -> Path:
    """A folder holding copies of the certificates, for configs with relative file names."""
    for path in certs.dir.glob("*.*"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path
