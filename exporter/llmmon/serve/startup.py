"""`llmmon serve` from its flags to a listening socket: settings, the web config, the collector
process (`llmmon.serve.supervisor`), then uvicorn under llmmon's connection limits.

The web stack is imported here and never by the collector process (`llmmon.serve.child`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from typing import Callable

import uvicorn

from llmmon import logs
from llmmon.bundle import replay_settings
from llmmon.collectors import discover
from llmmon.config import ConfigError, Settings, build_settings
from llmmon.incidents.store import Store
from llmmon.serve import httpserver
from llmmon.serve.app import create_app
from llmmon.serve.supervisor import Supervisor
from llmmon.serve.webconfig import WebConfig

log = logging.getLogger("llmmon")


def split_listen_address(address: str) -> tuple[str, int]:
    """`host:port`, `:port` (all IPv4 interfaces) or `[v6]:port` into uvicorn's host and port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r}: expected host:port, :port or [::]:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def incident_store(settings: Settings) -> Store:
    """The directory the collector `incidents` writes, read by this process straight from disk
    (the pages work while the collector process is down, and whether or not the collector is
    enabled: what it wrote before stays readable)."""
    return Store(settings.collectors["incidents"]["dir"])


def serve(args: argparse.Namespace) -> int:
    """`llmmon serve`: settings, the collector process, then the HTTP server until a signal;
    2 for a bad setting, 1 when the address cannot be bound.  What it leaves behind (the
    collector process, a replayed bundle's files) goes in `cleanup`, which runs however the
    server ends: uvicorn re-raises a stop signal, so code after the server would not run."""
    cleanup = contextlib.ExitStack()
    try:
        return _serve(args, cleanup)
    finally:
        cleanup.close()


def _serve(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    classes = discover()
    try:
        settings = build_settings(args, classes)
        if args.replay:
            scratch = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="llmmon-replay-"))
            settings = replay_settings(args.replay, settings, scratch)
        logs.setup(settings["log.level"], settings["log.format"])
        host, port = split_listen_address(settings["web.listen_address"])
        web = None
        if settings["web.config_file"]:
            web = WebConfig.load(settings["web.config_file"])
        fds = httpserver.raise_fd_limit()  # before the collector process inherits the limit
        supervisor = Supervisor(settings, None if web is None else lambda: web.refused_reloads)
        cleanup.callback(supervisor.stop)
        supervisor.start()  # the collector process: builds the collectors, or says why not
    except (ConfigError, ValueError) as exc:
        print(f"llmmon serve: {exc}", file=sys.stderr)
        return 2
    return _listen(settings, host, port, web, supervisor, fds, cleanup.close)


def _listen(settings: Settings, host: str, port: int, web: WebConfig | None,
            supervisor: Supervisor, fds: tuple[int, int], after: Callable[[], None]) -> int:
    """Serve the supervisor until SIGTERM or SIGINT; 1 when the address cannot be bound."""
    app = create_app(supervisor, supervisor.routes, settings["web.telemetry_path"],
                     incident_store(settings))
    if web is not None:
        app = web.protect(app)
    fd_before, fd_limit = fds
    limits = httpserver.ConnectionLimits(
        max_connections=httpserver.connection_cap(settings["web.max_connections"], fd_limit),
        read_timeout=settings["web.read_timeout"], idle_timeout=settings["web.idle_timeout"],
        shutdown_grace=settings["web.shutdown_grace"])
    # log_config=None: uvicorn's own lines go through llmmon's handler and format.
    config = uvicorn.Config(app, host=host, port=port, http="h11", log_level="warning",
                            log_config=None, access_log=False, lifespan="off",
                            timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=limits.shutdown_grace)  # type: ignore
    if web is not None:
        config = web.configure(config)
    try:
        sock = httpserver.bind(host, port, config.backlog)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port,
                  os.strerror(exc.errno) if exc.errno else exc)
        return 1
    if limits.max_connections < settings["web.max_connections"]:
        log.warning("--web.max-connections lowered from %d to %d: the open-file limit is %d "
                    "and %d descriptors are kept for collectors", settings["web.max_connections"],
                    limits.max_connections, fd_limit, httpserver.FD_RESERVE)
    log.info("listening on %s:%d (%s), metrics at %s; up to %d connections, open-file limit "
             "%d (was %d)", host, sock.getsockname()[1],
             "https" if web is not None and web.serves_tls else "http",
             settings["web.telemetry_path"], limits.max_connections, fd_limit, fd_before)
    server = httpserver.HTTPServer(config, httpserver.Listener(sock, limits), after=after)
    server.run()
    return 0 if server.started else 1
