"""A real headless Chromium, driven over the DevTools protocol to see a page as a person does.

The protocol runs over a pipe (`--remote-debugging-pipe`: Chromium reads commands on fd 3 and
writes answers on fd 4, each JSON message ended by a NUL byte), so no port is opened, no
WebSocket framing is needed and no client library is added. Chromium runs in a session of its
own and the whole process group is killed at the end, renderers and all.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

WIDTH, HEIGHT = 1280, 800
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--no-default-browser-check", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio",
         "--remote-debugging-pipe", f"--window-size={WIDTH},{HEIGHT}")
TIMEOUT = 30.0


class Browser:
    def __init__(self, binary: str, profile: Path, log: Path) -> None:
        commands, self._to_browser = os.pipe()
        self._from_browser, answers = os.pipe()
        # The child's ends become its fd 3 and 4; numbered from 10 here first, so that moving
        # one cannot overwrite the other.
        commands, answers = (_renumbered(fd) for fd in (commands, answers))
        self._log = open(log, "wb")
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{commands} 4>&{answers} '
             f"{commands}<&- {answers}>&-", binary, *FLAGS, f"--user-data-dir={profile}",
             "about:blank"],
            pass_fds=(commands, answers), stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)
        os.close(commands)
        os.close(answers)
        self._buffer = b""
        self._ids = iter(range(1, 1 << 30))
        self._events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send a command and return its result; AssertionError with Chromium's error."""
        ident = next(self._ids)
        message = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        answer = self._receive(lambda m: m.get("id") == ident, f"the answer to {method}")
        assert "error" not in answer, f"{method}: {answer['error']}"
        return answer.get("result", {})

    def event(self, method: str, session: str) -> dict[str, Any]:
        """The first event `method` of `session` not taken yet (waiting for it)."""
        def wanted(m: dict[str, Any]) -> bool:
            return m.get("method") == method and m.get("sessionId") == session
        for seen in self._events:
            if wanted(seen):
                self._events.remove(seen)
                return seen
        found = self._receive(wanted, f"event {method}")
        self._events.remove(found)
        return found

    def _receive(self, wanted: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" not in message:  # an event: kept for `event`
                    self._events.append(message)
                if wanted(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                raise AssertionError(f"Chromium: no {what} within {TIMEOUT:g} s (exit code "
                                     f"{self.process.poll()})")
            if select.select([self._from_browser], [], [], left)[0]:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise AssertionError(f"Chromium closed its pipe before {what}")
                self._buffer += chunk

    def tab(self) -> Tab:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        tab = Tab(self, session)
        tab.call("Page.enable")
        tab.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                 deviceScaleFactor=1, mobile=False)
        return tab

    def close(self) -> None:
        """Close politely, then kill the process group whatever happened (idempotent)."""
        with contextlib.suppress(OSError, AssertionError):
            if self.process.poll() is None:
                self.call("Browser.close")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: renderers too
        self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()


def _renumbered(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Tab:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, self.session, **params)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event (redirects followed)."""
        answer = self.call("Page.navigate", url=url)
        assert not answer.get("errorText"), f"{url}: {answer['errorText']}"
        self.browser.event("Page.loadEventFired", self.session)

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        """The viewport as PNG, also written to `path` (a test artefact)."""
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return png


def chromium() -> str:
    """The Chromium binary; the test fails (it is not skipped) when it is missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `scripts/install.sh --test` installs Debian's "
                    "chromium package (apt-get install chromium)")
    return found


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[Browser]:
    browser = Browser(chromium(), tmp / "chromium-profile", tmp / "chromium.log")
    try:
        yield browser
    finally:
        browser.close()


# PNG, read just enough to tell a page from a blank screen ------------------------------

def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def colours(png: bytes, rows: int) -> int:
    """Distinct colours in the first `rows` rows of an 8-bit RGB or RGBA PNG."""
    width, height = png_size(png)
    depth, kind = png[24], png[25]
    assert depth == 8 and kind in (2, 6), f"PNG of depth {depth}, colour type {kind}"
    size = 3 if kind == 2 else 4
    data, at = b"", 8
    while at < len(png):
        length, tag = struct.unpack(">I4s", png[at:at + 8])
        if tag == b"IDAT":
            data += png[at + 8:at + 8 + length]
        at += 12 + length
    raw = zlib.decompress(data)
    stride, previous, seen = width * size, bytearray(width * size), set()
    for y in range(min(rows, height)):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(raw[start], line, previous, size)
        seen.update(bytes(line[x:x + size]) for x in range(0, stride, size))
        previous = line
    return len(seen)


def _unfilter(kind: int, line: bytearray, above: bytearray, size: int) -> None:
    for i in range(len(line)):
        left = line[i - size] if i >= size else 0
        up, corner = above[i], above[i - size] if i >= size else 0
        if kind == 1:
            line[i] = (line[i] + left) & 255
        elif kind == 2:
            line[i] = (line[i] + up) & 255
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 255
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                  else corner)) & 255
