"""`llmmon copy-reporter DIR`: the injected init container's command (see `llmmon webhook`).

It exits 0 whatever happens: a failing init container would stop the pod, and a trainer whose
PYTHONPATH names a boot directory that is not there just runs without the reporter (what went
wrong is in the init container's log).
"""

from __future__ import annotations

import argparse
import sys

from llmmon.inject.reportercopy import copy_reporter
from llmmon.inject.trainerenv import prepare_job_dirs


def run(args: argparse.Namespace) -> int:
    try:
        boot = copy_reporter(args.dest)
        print(f"llmmon copy-reporter: put {boot} first on PYTHONPATH")
    except OSError as exc:
        print(f"llmmon copy-reporter: {exc}; training runs without the reporter",
              file=sys.stderr)
    for problem in prepare_job_dirs(args.job_dir):
        print(f"llmmon copy-reporter: {problem}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "copy-reporter", help="Copy the reporter package into a directory (init containers).",
        description="Copy the llmmon_reporter package (standard library only, with its boot/ "
        "start-up hook) into DEST/llmmon_reporter, replacing an older copy, and create the "
        "job's Flight Recorder dump and pipe directories as `llmmon launch` does. `llmmon "
        "webhook` runs this in the init container it injects; DEST/llmmon_reporter/boot then "
        "goes first on the trainer's PYTHONPATH. Exits 0 even on failure (the pod must start).")
    parser.add_argument("dest", metavar="DEST", help="directory to copy into (the pod's "
                        "emptyDir)")
    parser.add_argument("--job-dir", action="append", default=[], metavar="DIR",
                        help="a directory to create mode 0777 (repeatable)")
    parser.set_defaults(func=run)
