"""Helpers for the deployment tests: rendered manifests, certificates, live exporters,
processes of other users."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import socket
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"


def wait_for_port(port: int, process: subprocess.Popen, log: Path,
                  timeout: float = 30.0) -> None:
    """Return once something accepts on 127.0.0.1:port; fail if the process dies first."""
    def accepts() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode} before listening:"
                                 f"\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        return False
    wait_for(accepts, timeout, f"a listener on port {port}",
             context=lambda: log.read_text(errors="replace"))


def write(tmp_path: Path, config: dict) -> Path:
    """`config` as tmp_path/web-config.yml."""
    path = tmp_path / "web-config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize` output as a list of objects (the real renderer, offline)."""
    kubectl = require("kubectl", KUBECTL_HINT)
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [o for o in objects
               if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1 signed by it, a client certificate signed by
    it, and a client certificate from an unrelated CA."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def issue(cwd: Path, name: str, ca: str, subject: str, ext: str) -> None:
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
             cwd=cwd)


def ca(cwd: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign", cwd=cwd)


@dataclass(frozen=True)
class Exporter:
    port: int
    process: subprocess.Popen

    @property
    def https(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


INSTALLED_BY_SCRIPT = "scripts/install.sh --test installs it"
KUBECTL_HINT = ("the manifest tests render with it; it is not in Debian's archive: install it "
                "from your Kubernetes packages (https://kubernetes.io/docs/tasks/tools/)")


def require(binary: str, hint: str = INSTALLED_BY_SCRIPT) -> str:
    """The binary's path, or a failure that says what is missing and how to get it."""
    path = shutil.which(binary)
    assert path, f"{binary} is not installed: {hint}"
    return path


CLONE_NEWNS = 0x00020000


def _read_only_mounts(paths: Sequence[Path]) -> None:
    """A private mount namespace in which each path is a read-only bind mount of itself, as
    Kubernetes' `readOnly: true` and systemd's ReadOnlyPaths= make it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)
    for path in paths:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True,
                       capture_output=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True,
                       capture_output=True)


@dataclass
class Child:
    """A forked process running as another user; what it writes to fd 1 and 2, line by line.
    A child that returns from its work writes the result as its last line (JSON)."""

    pid: int
    fd: int
    buffer: bytes = b""
    lines: list[str] = field(default_factory=list)
    reaped: bool = False

    def _fill(self, deadline: float) -> bool:
        """Read what is there before the deadline; False at end of output."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"child {self.pid} silent; so far: {self.lines}")
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        self.lines += [line.decode(errors="replace") for line in complete]
        return bool(chunk)

    def line(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        seen = len(self.lines)
        while len(self.lines) == seen:
            if not self._fill(deadline):
                raise AssertionError(f"child {self.pid} ended; output: {self.lines}")
        return self.lines[seen]

    def wait(self, timeout: float = 20.0) -> list[str]:
        """All its output, once it has exited 0."""
        deadline = time.monotonic() + timeout
        while self._fill(deadline):
            pass
        os.close(self.fd)
        _, status = os.waitpid(self.pid, 0)
        self.reaped = True
        output = self.lines + ([self.buffer.decode(errors="replace")] if self.buffer else [])
        assert os.waitstatus_to_exitcode(status) == 0, "\n".join(output)
        return output

    def result(self, timeout: float = 20.0) -> Any:
        return json.loads(self.wait(timeout)[-1])

    def kill(self) -> None:
        """Stop it if a failed test left it running; a reaped pid is never signalled."""
        if not self.reaped:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
            os.close(self.fd)
            self.reaped = True


def fork_as(uid: int, gid: int, work: Callable[[], Any], *, umask: int = 0o022,
            read_only: Sequence[Path] = ()) -> Child:
    """Run `work` in a forked child as uid:gid without supplementary groups (the kernel drops
    every capability when uid 0 goes), after making `read_only` read-only mounts. The child
    needs no interpreter of its own: a non-root user may not be able to start this one."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            if read_only:
                _read_only_mounts(read_only)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.umask(umask)
            os.write(1, json.dumps(work()).encode() + b"\n")
            code = 0
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write_end)
    return Child(pid, read_end)
