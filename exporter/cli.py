"""The `llmmon` command: `serve` runs the node daemon; other subcommands are discovered."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from typing import TYPE_CHECKING

from llmmon import __version__, commands
from llmmon.collectors import discover
from llmmon.config import ConfigError, Settings, add_serve_arguments, build_settings

if TYPE_CHECKING:
    from llmmon.relay import Relay
    from llmmon.webconfig import WebConfig

log = logging.getLogger("llmmon")


def _serve(args: argparse.Namespace) -> int:
    from llmmon import httpserver, logs
    from llmmon.daemon import split_listen_address
    from llmmon.relay import Relay

    classes = discover()
    try:
        settings = build_settings(args, classes)
        if args.replay:
            from llmmon.capture import replay_settings

            settings = replay_settings(args.replay, settings)
        logs.setup(settings["log.level"], settings["log.format"])
        host, port = split_listen_address(settings["web.listen_address"])
        web = None
        if settings["web.config_file"]:
            from llmmon.webconfig import WebConfig

            web = WebConfig.load(settings["web.config_file"])
        fds = httpserver.raise_fd_limit()  # before the collector process inherits the limit
        relay = Relay(settings)
        relay.start()  # the collector process: builds the collectors, or says why it cannot
    except (ConfigError, ValueError) as exc:
        print(f"llmmon serve: {exc}", file=sys.stderr)
        return 2
    try:
        return _listen(settings, host, port, web, relay, fds)
    finally:
        relay.stop()


def _listen(settings: Settings, host: str, port: int, web: WebConfig | None, relay: Relay,
            fds: tuple[int, int]) -> int:
    """Serve the relay until SIGTERM or SIGINT; 1 when the address cannot be bound."""
    import uvicorn

    from llmmon import httpserver
    from llmmon.app import create_app

    app = create_app(relay, relay.routes, settings["web.telemetry_path"])
    if web is not None:
        app = web.protect(app)
    fd_before, fd_limit = fds
    limits = httpserver.Limits(
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
    server = httpserver.Server(config, httpserver.Listener(sock, limits), after=relay.stop)
    server.run()
    return 0 if server.started else 1


def _docs(args: argparse.Namespace) -> int:
    from llmmon import docsgen

    sys.stdout.write(docsgen.RENDERERS[args.what]())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmmon", description="Monitoring for LLM training clusters: node exporter, "
        "training-process reporter and tools.")
    parser.add_argument("--version", action="version", version=f"llmmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve", help="Run the node exporter daemon.",
        description="Run the node exporter: collectors sample in the background, /metrics "
        "serves the last snapshot. Settings come from defaults, then --config.file, then "
        "flags.")
    add_serve_arguments(serve, discover())
    serve.add_argument("--replay", metavar="ARCHIVE",
                       help="Serve an `llmmon capture` archive instead of this node's inputs "
                       "(collectors as the captured node ran them).")
    serve.set_defaults(func=_serve)

    docs = sub.add_parser("docs", help="Print generated reference documentation.")
    docs.add_argument("what", choices=("metrics", "config"))
    docs.set_defaults(func=_docs)

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
