"""`llmmon webhook`: the mutating admission webhook that injects the reporter into pods.

A pod that opts in (label llmmon.io/inject=true, or its namespace's label) gets what `llmmon
launch` gives a command, with no change to its image or command: deploy/kubernetes/webhook/
and docs/deployment.md (Zero-touch injection).
"""

from __future__ import annotations

import argparse
import sys

from llmmon import logs
from llmmon.inject.podpatch import Settings
from llmmon_reporter import layout


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT (all IPv4 addresses)."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def run(args: argparse.Namespace) -> int:
    from llmmon.inject import server  # the web stack, for this command only

    logs.setup("info", args.log_format)
    settings = Settings(image=args.image, reporter_dir=args.reporter_dir, spool=args.spool,
                        pipe_dir=args.pipe_dir, fr_dir=args.fr_dir, fr_buffer=args.fr_buffer,
                        nccl_log=not args.no_nccl_log)
    host, port = args.listen
    try:
        return server.run(settings, host, port, args.tls_cert_file, args.tls_key_file)
    except (OSError, ValueError) as exc:
        print(f"llmmon webhook: {exc}", file=sys.stderr)
        return 1


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "webhook", help="Serve the admission webhook that injects the reporter into pods.",
        description="Serve a Kubernetes mutating admission webhook (AdmissionReview v1, HTTPS) "
        "that gives every pod labelled llmmon.io/inject=true (or in a namespace so labelled) "
        "what `llmmon launch` gives a command: an init container copies the reporter into an "
        "emptyDir, its start-up hook goes first on PYTHONPATH, and the job id, Flight Recorder "
        "settings and the node's spool, pipe and dump directories are added. Variables a "
        "container sets are kept. Paths: POST /mutate, POST /mutate/namespace, GET /healthz. "
        "See docs/deployment.md.")
    parser.add_argument("--tls-cert-file", required=True, metavar="FILE", help="serving certificate (PEM); "
                        "re-read when it changes")
    parser.add_argument("--tls-key-file", required=True, metavar="FILE", help="its private key (PEM)")
    parser.add_argument("--listen", type=listen_address, default=("0.0.0.0", 8443),
                        metavar="HOST:PORT", help="address to serve on (default :8443)")
    parser.add_argument("--image", required=True, metavar="IMAGE",
                        help="image of the init container (the llmmon image: it runs "
                        "`llmmon copy-reporter`)")
    parser.add_argument("--reporter-dir", default="/llmmon-reporter", metavar="DIR",
                        help="where the reporter's emptyDir is mounted in the pod "
                        "(default %(default)s)")
    parser.add_argument("--spool", default=layout.DEFAULT_SPOOL, metavar="DIR",
                        help="rank spool host path, mounted at the same path (default "
                        "%(default)s)")
    parser.add_argument("--pipe-dir", default=layout.DEFAULT_PIPE_DIR, metavar="DIR",
                        help="Flight Recorder dump pipes host path (default %(default)s)")
    parser.add_argument("--fr-dir", default=layout.DEFAULT_FR_DIR, metavar="DIR",
                        help="Flight Recorder dumps host path (default %(default)s)")
    parser.add_argument("--fr-buffer", type=int, default=2000, metavar="N",
                        help="Flight Recorder ring size in entries (default %(default)s)")
    parser.add_argument("--no-nccl-log", action="store_true",
                        help="Do not point NCCL's INFO log at a file in the dump directory "
                        "(done only for containers that set neither NCCL_DEBUG, NCCL_DEBUG_FILE "
                        "nor envFrom)")
    parser.add_argument("--log.format", dest="log_format", choices=("logfmt", "json"),
                        default="logfmt")
    parser.set_defaults(func=run)
