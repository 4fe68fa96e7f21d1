"""HTTP serving that holds against hostile clients: bounded connections, deadlines on requests.

uvicorn accepts every connection and waits for a request without end (its keep-alive timer
starts only after a first response), and asyncio gives each accepted TLS socket a 256 KiB
buffer before a byte is read: 1,100 bare connections ran the daemon out of file descriptors,
720 idle TLS connections past its memory limit. So llmmon accepts connections itself:

- the socket is bound before anything else starts, so a port in use is one log line;
- every accepted connection is counted from accept to close, TLS handshake included; at
  `--web.max-connections` one is closed to make room: one that never completed a request, then
  one stuck (its client does not read the response, or its request was refused and waits out
  the refusal delay), then the one idle longest; so a scraper that connects during a flood
  still gets in, and one on a keep-alive connection keeps it;
- TLS starts (and asyncio allocates its buffer) only once a client sends its first byte;
- a request, headers and body, must arrive within `--web.read-timeout` of its first byte (of
  the accept, TLS handshake included, for a connection's first request), and a response must
  leave within as long once the client stops reading it (pipelined requests whose answers are
  never read hold a connection no longer than a request that never arrives); an idle
  keep-alive connection is closed after `--web.idle-timeout` (uvicorn's own timer);
- the soft open-file limit is raised to the hard one, and connections stay `FD_RESERVE`
  descriptors below it, for the collectors;
- on SIGTERM listening stops, one line is logged, and requests in progress get
  `--web.shutdown-grace` before their connections are closed.

What was closed is logged as one summary a minute at most, never a line per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("llmmon.http")

FD_RESERVE = 128  # descriptors kept for collectors, NVML, netlink sockets and log files
SUMMARY_PERIOD = 60.0  # seconds between two summaries of closed connections
ACCEPT_RETRY = 0.1  # seconds to wait after a failed accept (out of descriptors or memory)
ACCEPT_BATCH = 64  # connections accepted per wakeup; fewer than FD_RESERVE
TICK = 1.0  # seconds between the server loop's wakeups (uvicorn's: 0.1)
# Set in a request's ASGI scope by an app that refused it and holds the answer back on purpose
# (basic auth's refusal delay): its connection may be closed to make room for another client.
REFUSED = "llmmon.refused"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    read_timeout: float
    idle_timeout: float
    shutdown_grace: float


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an infinite hard limit some kernels refuse as soft
            return soft, soft
    return soft, hard


def connection_cap(requested: int, fd_limit: int) -> int:
    """`requested`, lowered so that FD_RESERVE descriptors stay free whatever clients do."""
    if fd_limit == resource.RLIM_INFINITY:
        return requested
    return max(1, min(requested, fd_limit - FD_RESERVE))


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """The listening socket (OSError when the address is in use or not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    sock.setblocking(False)
    return sock


class Connection(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus what the listener needs: when the client started to
    owe a request (None while it owes nothing) and whether a response is being produced."""

    def __init__(self, *args: Any, listener: Listener, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self.owed_since: float | None = time.monotonic()  # the first request, from accept
        self.opening: asyncio.Task[None] | None = None  # until connection_made (TLS handshake)
        self.unowned: socket.socket | None = None  # accepted, not yet handed to a transport
        self.served = False  # a response completed on it
        self.blocked_since: float | None = None  # the client stopped reading our response

    @property
    def busy(self) -> bool:
        return self.conn.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)

    @property
    def stuck(self) -> bool:
        """A response in progress that is not getting through, or held back on purpose."""
        refused = self.cycle is not None and bool(self.cycle.scope.get(REFUSED))
        return self.busy and (self.blocked_since is not None or refused)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.blocked_since is None:
            self.blocked_since = time.monotonic()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.blocked_since = None

    def _owes_request(self) -> bool:
        """True while part of a request (headers or body) has arrived and the rest has not."""
        theirs = self.conn.their_state
        if theirs is h11.SEND_BODY:
            return True
        return (theirs is h11.IDLE and self.conn.our_state is h11.IDLE
                and bool(self.conn.trailing_data[0]))

    def data_received(self, data: bytes) -> None:
        if self.owed_since is None:
            self.owed_since = time.monotonic()
        super().data_received(data)
        if not self._owes_request():
            self.owed_since = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.served = True
        self.listener.touch(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.listener.forget(self)

    def close(self) -> None:
        """Drop the connection now: no response is owed (idle, or the client is too slow)."""
        if self.transport is not None:
            self.transport.abort()
        elif self.opening is not None:
            self.opening.cancel()

    def opened(self, _task: asyncio.Task[None]) -> None:
        """The opening task ended: connected, or failed, closed or cancelled (maybe before it
        ran at all); then the socket is closed here and the connection forgotten."""
        self.opening = None
        if self.unowned is not None:
            self.unowned.close()
            self.unowned = None
        if self.transport is None:
            self.listener.forget(self)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fd = sock.fileno()  # still the key to remove if the socket is closed while waiting
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class Listener:
    """Accepts connections up to a bound, times out slow ones; quacks like asyncio.Server for
    uvicorn's shutdown (close, wait_closed)."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits) -> None:
        self.sock = sock
        self.limits = limits
        self._open: OrderedDict[Connection, None] = OrderedDict()  # least recently useful first
        self._tasks: list[asyncio.Task[None]] = []
        self._closed: Counter[str] = Counter()
        self._summary_at = float("-inf")

    def start(self, make: Callable[[Listener], Connection], tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._accept(make, tls)), loop.create_task(self._sweep())]

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def touch(self, connection: Connection) -> None:
        if connection in self._open:
            self._open.move_to_end(connection)

    def forget(self, connection: Connection) -> None:
        self._open.pop(connection, None)

    async def _accept(self, make: Callable[[Listener], Connection],
                      tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await _readable(loop, self.sock)
            # What is queued, as asyncio's own server does, but a bounded batch: the closes of
            # connections dropped to make room run between batches, releasing descriptors.
            for _ in range(ACCEPT_BATCH):
                try:
                    sock, _ = self.sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:  # EMFILE, ENOBUFS, ECONNABORTED ...: counted, not logged
                    self._closed[f"accept failed: {exc.strerror or exc}"] += 1
                    self._make_room()
                    await asyncio.sleep(ACCEPT_RETRY)
                    break
                sock.setblocking(False)
                # asyncio sets TCP_NODELAY only where the socket's proto is IPPROTO_TCP, and
                # create_server's are 0: without it a response's body, written after its
                # headers, waits for the client's delayed ACK (40 ms on a keep-alive
                # connection). A socket that refuses it is served anyway: this loop must live.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._admit(make, sock, tls)

    def _admit(self, make: Callable[[Listener], Connection], sock: socket.socket,
               tls: ssl.SSLContext | None) -> None:
        if len(self._open) >= self.limits.max_connections and not self._make_room():
            sock.close()
            self._closed["refused: every connection has a request in progress"] += 1
            return
        connection = make(self)
        connection.unowned = sock
        self._open[connection] = None
        connection.opening = asyncio.get_running_loop().create_task(
            self._open_connection(connection, sock, tls))
        connection.opening.add_done_callback(connection.opened)

    @staticmethod
    async def _open_connection(connection: Connection, sock: socket.socket,
                               tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            if tls is not None:  # asyncio's TLS buffer (256 KiB) only once the client speaks
                await _readable(loop, sock)
            connection.unowned = None  # the transport made now owns the socket, closes it
            await loop.connect_accepted_socket(lambda: connection, sock, ssl=tls)
        except (asyncio.CancelledError, Exception):  # handshake failed, or closed by us
            pass  # Connection.opened cleans up

    def _make_room(self) -> bool:
        """Close one connection: idle and never served (a flood's), else stuck (see
        Connection.stuck), else the one idle longest; False when every connection has a
        request in progress that is getting through."""
        idle = [c for c in self._open if not c.busy]
        victim = next((c for c in idle if not c.served), None) or next(
            (c for c in self._open if c.stuck), None) or (idle[0] if idle else None)
        if victim is None:
            return False
        self.forget(victim)
        victim.close()
        self._closed[f"closed at --web.max-connections={self.limits.max_connections}"] += 1
        return True

    async def _sweep(self) -> None:
        period = min(1.0, self.limits.read_timeout / 4)
        while True:
            await asyncio.sleep(period)
            deadline = time.monotonic() - self.limits.read_timeout
            late = [c for c in self._open if c.owed_since is not None and c.owed_since < deadline]
            unread = [c for c in self._open if c not in late and c.blocked_since is not None
                      and c.blocked_since < deadline]
            for connection in late + unread:
                self.forget(connection)
                connection.close()
            if late:
                self._closed["request not received within --web.read-timeout="
                             f"{self.limits.read_timeout:g}s"] += len(late)
            if unread:
                self._closed["response not read within --web.read-timeout="
                             f"{self.limits.read_timeout:g}s"] += len(unread)
            self._summarise()

    def _summarise(self) -> None:
        now = time.monotonic()
        if self._closed and now - self._summary_at >= SUMMARY_PERIOD:
            log.warning("connections dropped since the last report: %s (%d open)",
                        "; ".join(f"{n} {why}" for why, n in self._closed.most_common()),
                        len(self._open))
            self._closed.clear()
            self._summary_at = now

    def abort_all(self) -> int:
        left = list(self._open)
        for connection in left:
            self.forget(connection)
            connection.close()
        return len(left)

    # asyncio.Server's part that uvicorn's shutdown uses
    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


class HTTPServer(uvicorn.Server):
    """uvicorn's server on an already bound socket, accepting through a Listener; `after`
    runs once its connections are closed (uvicorn then re-raises the signal that stopped it,
    so code after run() would not)."""

    def __init__(self, config: uvicorn.Config, listener: Listener,
                 after: Callable[[], None] = lambda: None) -> None:
        super().__init__(config)
        self.listener = listener
        self.after = after
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        """uvicorn's loop, woken every TICK instead of ten times a second (0.2 % of a core on
        this VM, for a Date header with a second's resolution), and at once by a stop signal."""
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        ticks = 0
        while not await self.on_tick(ticks):
            ticks = (ticks + 10) % 864000  # uvicorn counts tenths: every tick renews the date
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)  # a signal handler: wake the loop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        config = self.config

        def make(listener: Listener) -> Connection:
            return Connection(config=config, server_state=self.server_state,
                              app_state=self.lifespan.state, listener=listener)

        self.listener.start(make, config.ssl)
        self.servers = [self.listener]  # type: ignore[list-item]
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        log.info("shutting down: no new connections; %d open, requests in progress get up "
                 "to %gs", self.listener.open_connections, self.config.timeout_graceful_shutdown)
        await super().shutdown(sockets)
        left = self.listener.abort_all()
        if left:
            log.warning("closed %d connection(s) still open after the %gs grace", left,
                        self.config.timeout_graceful_shutdown)
        self.after()
