"""`llmmon capture`: this node's raw collector inputs in one archive for a support case."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

from llmmon.collectors import discover
from llmmon.config import ConfigError, add_serve_arguments, build_settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "capture", help="Bundle this node's raw collector inputs into a tar.gz.",
        description="Write the files the collectors read (sysfs, procfs), an NVML snapshot of "
        "every GPU, ethtool and link statistics and the rank spool into one archive. Takes "
        "the same flags and config file as `llmmon serve`, so it reads what the daemon reads; "
        "`llmmon serve --replay ARCHIVE` serves it elsewhere. See docs/simulate.md.")
    parser.add_argument("--output", "-o", type=Path, metavar="PATH",
                        help="archive to write (default: llmmon-capture-HOST-UTCTIME.tar.gz)")
    add_serve_arguments(parser, discover(), web=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llmmon.bundle import capture

    try:
        settings = build_settings(args, discover())
    except (ConfigError, ValueError) as exc:
        print(f"llmmon capture: {exc}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    output = args.output or Path(f"llmmon-capture-{socket.gethostname()}-{stamp}.tar.gz")
    try:
        manifest = capture(settings, output)
    except OSError as exc:
        print(f"llmmon capture: cannot write {output}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {output}: {manifest['gpus']} GPU snapshot(s); "
          f"{len(manifest['problems'])} problem(s)")
    for problem in manifest["problems"]:
        print(f"  {problem}")
    return 0
