"""`llmmon copy-reporter DIR`: the injected init container's command (see `llmmon webhook`)."""

from __future__ import annotations

import argparse
import sys

from llmmon.inject.reportercopy import copy_reporter


def run(args: argparse.Namespace) -> int:
    try:
        boot = copy_reporter(args.dest)
    except OSError as exc:
        print(f"llmmon copy-reporter: {exc}", file=sys.stderr)
        return 1
    print(f"llmmon copy-reporter: put {boot} first on PYTHONPATH")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "copy-reporter", help="Copy the reporter package into a directory (init containers).",
        description="Copy the llmmon_reporter package (standard library only, with its boot/ "
        "start-up hook) into DEST/llmmon_reporter, replacing an older copy. `llmmon webhook` "
        "runs this in the init container it injects; DEST/llmmon_reporter/boot then goes "
        "first on the trainer's PYTHONPATH.")
    parser.add_argument("dest", metavar="DEST", help="directory to copy into (the pod's emptyDir)")
    parser.set_defaults(func=run)
