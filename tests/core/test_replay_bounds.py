"""A support bundle is a file from elsewhere: `llmmon serve --replay` refuses a bad one in one
line, unpacks a bounded amount, and removes what it unpacked however it is stopped; `llmmon
capture` copies spool files only as the regular files they are when opened."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llmmon import bundle
from tests.conftest import FIXTURES, ROOT

NODE = ("--collector.disable-defaults", "--collector.disk",
        f"--path.procfs={FIXTURES / 'proc'}", f"--path.sysfs={FIXTURES / 'sys'}")


def _archive(path: Path, manifest: object, extra: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {"manifest.json": json.dumps(manifest).encode(),
                           **(extra or {})}.items():
            info = tarfile.TarInfo(f"{bundle.TOP}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


GOOD = {"format": bundle.FORMAT, "captured_at": 1.7e9, "collectors": {"disk": True}, "gpus": 0}


@pytest.mark.parametrize("change", [
    {"captured_at": None}, {"captured_at": "yesterday"}, {"captured_at": True},
    {"collectors": ["disk"]}, {"collectors": {"disk": "yes"}}, {"gpus": -1}, {"gpus": "8"},
])
def test_a_manifest_of_the_wrong_shape_is_refused_naming_the_field(tmp_path: Path,
                                                                   change) -> None:
    manifest = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    archive = _archive(tmp_path / "bad.tar.gz", manifest)
    (tmp_path / "into").mkdir()
    with pytest.raises(bundle.CaptureError, match=f"manifest.json {next(iter(change))}"):
        bundle.unpack(str(archive), tmp_path / "into")


def test_serve_refuses_a_bad_manifest_in_one_line(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "bad.tar.gz", {**GOOD, "captured_at": "yesterday"})
    result = subprocess.run([sys.executable, "-m", "llmmon", "serve", f"--replay={archive}"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("llmmon serve: ") and result.stderr.count("\n") == 1
    assert "manifest.json captured_at" in result.stderr and "Traceback" not in result.stderr


def test_an_archive_past_the_caps_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle, "MAX_MEMBER_BYTES", 1000)
    archive = _archive(tmp_path / "big.tar.gz", GOOD, {"spool/big": b"x" * 1001})
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(bundle.CaptureError, match="larger than a capture can be"):
        bundle.unpack(str(archive), into)
    assert not list(into.iterdir())
    monkeypatch.setattr(bundle, "MAX_MEMBER_BYTES", 1 << 20)
    monkeypatch.setattr(bundle, "MAX_UNPACKED_BYTES", 1500)
    archive = _archive(tmp_path / "many.tar.gz", GOOD, {"a": b"x" * 800, "b": b"x" * 800})
    with pytest.raises(bundle.CaptureError, match="larger than a capture can be"):
        bundle.unpack(str(archive), into)
    assert not list(into.iterdir())


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_replay_removes_what_it_unpacked_when_stopped(serve, tmp_path: Path, stop) -> None:
    archive = tmp_path / "node.tar.gz"
    subprocess.run([sys.executable, "-m", "llmmon", "capture", f"--output={archive}", *NODE],
                   check=True, capture_output=True, timeout=120, cwd=ROOT)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = serve(f"--replay={archive}", env={**os.environ, "TMPDIR": str(scratch)})
    server.wait_collected()
    assert [p.name for p in scratch.iterdir()][0].startswith("llmmon-replay-")
    server.proc.send_signal(stop)
    server.proc.wait(30)
    assert not list(scratch.iterdir())


def test_a_spool_file_is_copied_only_as_a_regular_file_never_through_a_link(
        tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    link = tmp_path / "rank_0.1.json"
    link.symlink_to(secret)
    fifo = tmp_path / "rank_1.2.json"
    os.mkfifo(fifo)
    for path in (link, fifo):
        with pytest.raises(OSError):
            bundle.copy_regular(str(path), tmp_path / "out" / path.name, 1 << 20)
    assert not (tmp_path / "out").exists()
    real = tmp_path / "rank_2.3.json"
    real.write_text('{"rank": 2}')
    bundle.copy_regular(str(real), tmp_path / "out" / real.name, 1 << 20)
    assert (tmp_path / "out" / real.name).read_text() == '{"rank": 2}'
    with pytest.raises(OSError, match="larger than"):
        bundle.copy_regular(str(real), tmp_path / "out" / "cut", 4)
