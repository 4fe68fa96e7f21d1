"""`llmmon kmsg-relay`: copy the kernel log's NVRM records to a file the exporter can read."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from llmmon import logs

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "kmsg-relay", help="Relay the kernel log's NVRM (XID) records into a file.",
        description="Copy the NVIDIA driver's records of the kernel log (NVRM lines: XIDs) "
        "into a file, then append new ones as they come, for an exporter that cannot open "
        "/dev/kmsg itself (the Kubernetes overlay kernel-log runs this as a privileged "
        "sidecar; the exporter reads the file through collectors.gpu.kmsg_path). "
        "See docs/deployment.md.")
    parser.add_argument("--source", default="/dev/kmsg",
                        help="the kernel log (default %(default)s)")
    parser.add_argument("--out", required=True, help="the file to write (on a shared volume)")
    parser.add_argument("--max-records", type=int, default=10000,
                        help="NVRM records kept; past this the oldest half goes (default "
                        "%(default)s)")
    parser.add_argument("--log.format", dest="log_format", choices=("logfmt", "json"),
                        default="logfmt")
    parser.add_argument("--boot-id", default=BOOT_ID, help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if --out is written for this boot (a startup probe)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llmmon.gpu.nvrm_relay import Relay, check
    from llmmon.sources.kmsg import KmsgError

    if args.check:
        why = check(args.out, args.boot_id)
        if why:
            print(f"llmmon kmsg-relay: {why}", file=sys.stderr)
        return 1 if why else 0
    if args.max_records < 2:
        print("llmmon kmsg-relay: --max-records must be at least 2", file=sys.stderr)
        return 2
    logs.setup("info", args.log_format)
    log = logging.getLogger("llmmon.kmsg_relay")
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    relay = Relay(args.source, args.out, args.boot_id, args.max_records)
    try:
        held = relay.start()
    except (KmsgError, OSError) as exc:
        # The file says why, so the exporter reports it; a sidecar that exits is restarted.
        print(f"llmmon kmsg-relay: {exc}", file=sys.stderr)
        return 1
    log.info("relaying NVRM records from %s to %s (%d held)", args.source, args.out, held)
    try:
        relay.follow(stop)
    except (KmsgError, OSError) as exc:
        print(f"llmmon kmsg-relay: {exc}", file=sys.stderr)
        return 1
    finally:
        relay.close()
    return 0
