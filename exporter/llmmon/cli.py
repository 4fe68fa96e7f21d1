"""The `llmmon` command: `serve` runs the node daemon; other subcommands are discovered."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from llmmon import __version__, commands
from llmmon.collectors import discover
from llmmon.config import add_serve_arguments


def _serve(args: argparse.Namespace) -> int:
    from llmmon.serve.startup import serve

    return serve(args)


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
