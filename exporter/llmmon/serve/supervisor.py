"""The server's side of the collector process: starts and watches it, holds what it published.

`llmmon serve` runs its collectors in a child (`llmmon.serve.child`) so that no parsing
shares the GIL of the event loop answering scrapes. The supervisor serves the child's last
snapshot (a dead child's for `--sampler.max-staleness`, then `..._success 0` for each
collector), forwards /api/v1 calls to it, kills it when its RSS passes
`--sampler.max-rss-mib`, and starts it again after it died, backing off while it keeps dying.
It tells the child which exposition formats were scraped within `--sampler.format-idle`, so
that the child renders only those; the first scrape of another format waits for its render.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

from llmmon.config import ConfigError, Settings
from llmmon.metrics import Families
from llmmon.collector import RouteError
from llmmon.serve.routes import Routes
from llmmon.exposition import FORMATS, OM_EOF, OPENMETRICS, TEXT, finish, render
from llmmon.sampler import RESTARTS, SUCCESS

log = logging.getLogger("llmmon.serve.supervisor")
CALL_TIMEOUT = 10.0  # seconds an /api/v1 call waits for the collector process
WATCH_PERIOD = 2.0  # seconds between two RSS checks of the collector process
BACKOFF = (1.0, 30.0)  # first and longest wait before starting a dead collector process again
STEADY = 60.0  # a process that lived this long resets the backoff
STOP_GRACE = 5.0  # seconds the collector process has to stop before it is killed
FORMAT_WAIT = 5.0  # seconds a scrape of a format not rendered waits (Prometheus' timeout: 10)
# glibc gives each thread that allocates its own arena (up to 8 per core); a dozen collector
# threads then keep fragmented arenas resident. Two hold the RSS flat (the environment wins).
MALLOC_ARENAS = "2"


class Supervisor:
    def __init__(self, settings: Settings,
                 web_refused: Callable[[], int] | None = None) -> None:
        """`web_refused`: the web config's count of refused reloads, which the child exports
        (this process holds the web config; the child renders the exposition)."""
        self.settings = settings
        self.web_refused = web_refused
        self._told_refused: int | None = None  # what the child was last told of it
        self.max_rss = settings["sampler.max_rss_mib"] * 2**20
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.routes = Routes()
        self._conn: Connection | None = None
        self._collectors: list[str] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # a snapshot, or the process went down
        self.format_idle = settings["sampler.format_idle"]
        self._asked = dict.fromkeys(FORMATS, time.monotonic())  # when each format was scraped
        self._told = FORMATS  # what the child renders (it starts with both)
        self._send_lock = threading.Lock()  # API threads and stop() share the connection
        self._snapshot: tuple[bytes, bytes] | None = None  # text, OpenMetrics without # EOF
        self._states: list[dict[str, Any]] = []
        self._down_since: float | None = None
        self._generation = 0
        self._bodies: dict[tuple[bool, bool], tuple[int, bytes]] = {}
        self._calls: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the collector process and wait until it built its collectors; ConfigError
        when it could not (a bad setting only the collectors check)."""
        ready = self._spawn()
        if ready[0] == "error":
            raise ConfigError(ready[1])
        get, post, self._collectors = ready[1:]
        self.routes = Routes(get={key: self._forward("GET", key) for key in get},
                             post={key: self._forward("POST", key) for key in post})
        self._thread = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Tell the collector process to stop and wait for it (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        process, conn = self.process, self._conn
        if process is None:
            return
        try:
            if conn is not None:
                self._send(conn, ("stop",))
        except OSError:
            pass
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            log.warning("the collector process did not stop within %gs; killed", STOP_GRACE)
            process.kill()
            process.wait()

    def _spawn(self) -> tuple[Any, ...]:
        """A new collector process, given the settings; its first message (ready or error)."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENAS)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmmon.serve.child", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self._conn = conn = Connection(ours.detach())
        with self._lock:
            self._told = FORMATS
            self._told_refused = None
        conn.send((self.settings, self.restarts))
        try:
            return conn.recv()
        except (EOFError, OSError):
            code = self.process.wait()
            return ("error", f"the collector process exited ({_exit(code)}) before it was "
                    "ready; its log lines above say why")

    def _supervise(self) -> None:
        delay = BACKOFF[0]
        while not self._stopping.is_set():
            started = time.monotonic()
            why = self._relay()
            if self._stopping.is_set():
                return
            self._went_down()
            delay = BACKOFF[0] if time.monotonic() - started > STEADY else delay
            log.error("collector process %s; starting it again in %gs", why, delay)
            while not self._stopping.wait(delay):
                self.restarts += 1
                ready = self._spawn()
                if ready[0] == "ready":
                    break
                log.error("collector process could not start again: %s", ready[1])
                self._reap()
                delay = min(delay * 2, BACKOFF[1])
            delay = min(delay * 2, BACKOFF[1])

    def _relay(self) -> str:
        """Snapshots and replies until the process dies or is killed; why it ended."""
        conn, process = self._conn, self.process
        assert conn is not None and process is not None
        check_at = time.monotonic() + WATCH_PERIOD
        while True:
            try:
                if conn.poll(max(check_at - time.monotonic(), 0.0)):
                    self._receive(conn.recv())
            except (EOFError, OSError):
                return f"exited ({_exit(process.wait())})"
            if time.monotonic() < check_at:
                continue
            check_at = time.monotonic() + WATCH_PERIOD
            self._tell()
            rss = _rss(process.pid)
            if rss > self.max_rss:
                process.kill()
                process.wait()
                return (f"used {rss / 2**20:.0f} MiB, over --sampler.max-rss-mib="
                        f"{self.max_rss // 2**20}: killed")

    def _receive(self, message: tuple[Any, ...]) -> None:
        if message[0] == "snapshot":
            with self._lock:
                self._snapshot = message[1], message[2]
                self._states = message[3]
                self._down_since = None
                self._generation += 1
                self._arrived.notify_all()
        elif message[0] == "reply":
            call = self._calls.get(message[1])
            if call is not None:
                call[1].extend(message[2:])
                call[0].set()

    def _went_down(self) -> None:
        self._reap()
        with self._lock:
            self._down_since = time.monotonic()
            self._generation += 1
            self._arrived.notify_all()
        for event, answer in list(self._calls.values()):
            answer.extend((503, "the collector process died while answering"))
            event.set()

    def _reap(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # serving -------------------------------------------------------------------------
    def _tell_refused(self) -> None:
        """Tell the child the web config's refused reloads, if they changed."""
        count = self.web_refused() if self.web_refused is not None else None
        with self._lock:
            conn = self._conn
            if count is None or count == self._told_refused or conn is None:
                return
            self._told_refused = count
        try:
            self._send(conn, ("web_refused", count))
        except OSError:  # it died; the next one is told again
            pass

    def _tell(self) -> None:
        """Tell the child the formats scraped within --sampler.format-idle, if they changed."""
        now = time.monotonic()
        with self._lock:
            wanted = frozenset(fmt for fmt, at in self._asked.items()
                               if now - at < self.format_idle)
            conn = self._conn
            if wanted == self._told or conn is None:
                return
            self._told = wanted
        try:
            self._send(conn, ("formats", sorted(wanted)))
        except OSError:  # it died; the next one starts with both
            pass

    def _current(self) -> tuple[bytes | None, bytes | None]:
        """The snapshot to serve: the last published, or once the process has been down for
        --sampler.max-staleness, each collector failed (LLMMonCollectorFailing fires)."""
        with self._lock:
            down = self._down_since
            snapshot = self._snapshot
        if snapshot is not None and (
                down is None or time.monotonic() - down < self.settings["sampler.max_staleness"]):
            return snapshot
        families = Families()
        for name in self._collectors:
            families.add(SUCCESS, [name], 0)
        families.add(RESTARTS, [], self.restarts)
        return render(families)

    def body(self, openmetrics: bool, compressed: bool) -> bytes | None:
        """The exposition as served, cached per published snapshot (gzipped on demand); None
        while the child does not render that format (it is told to: see wait_body)."""
        key = (openmetrics, compressed)
        fmt = OPENMETRICS if openmetrics else TEXT
        with self._lock:
            self._asked[fmt] = time.monotonic()
            told = fmt in self._told
            generation = self._generation
            cached = self._bodies.get(key)
        if not told:
            self._tell()
        self._tell_refused()
        stale = self._down_since is not None
        if cached is not None and cached[0] == generation and not stale:
            return cached[1]
        text, om = self._current()
        fragment = om if openmetrics else text
        if fragment is None:
            return None
        data = finish(fragment + OM_EOF if openmetrics else fragment, compressed)
        with self._lock:
            self._bodies[key] = (generation, data)
        return data

    def wait_body(self, openmetrics: bool, compressed: bool) -> bytes | None:
        """body(), waiting up to FORMAT_WAIT for the child to render a format it had not
        (from its collectors' last runs: tens of milliseconds); None if it did not."""
        deadline = time.monotonic() + FORMAT_WAIT
        while True:
            with self._lock:
                generation = self._generation
            data = self.body(openmetrics, compressed)
            remaining = deadline - time.monotonic()
            if data is not None or remaining <= 0:
                return data
            with self._arrived:
                self._arrived.wait_for(lambda: self._generation != generation, remaining)

    def snapshot_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._states)

    def call(self, method: str, key: str, query: dict[str, str]) -> Any:
        """An /api/v1 endpoint's answer from the collector process; RouteError when it is not
        running (503), does not answer in CALL_TIMEOUT (504) or the endpoint failed."""
        conn = self._conn
        if conn is None or self._down_since is not None:
            raise RouteError(503, "the collector process is not running; it is being started "
                             "again (see the exporter log)")
        call_id = next(self._ids)
        event, answer = threading.Event(), []
        self._calls[call_id] = (event, answer)
        try:
            try:
                self._send(conn, ("call", call_id, method, key, query))
            except OSError:
                raise RouteError(503, "the collector process is not running") from None
            if not event.wait(CALL_TIMEOUT):
                raise RouteError(504, f"the collector process did not answer within "
                                 f"{CALL_TIMEOUT:g}s")
        finally:
            self._calls.pop(call_id, None)
        status, payload = answer
        if status != 200:
            raise RouteError(status, payload)
        return payload

    def _send(self, conn: Connection, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            conn.send(message)

    def _forward(self, method: str, key: str) -> Callable[..., Any]:
        if method == "GET":
            return lambda: self.call(method, key, {})
        return lambda query: self.call(method, key, query)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
