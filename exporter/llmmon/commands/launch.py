"""`llmmon launch -- torchrun ...`: run a training command with the reporter and Flight Recorder.

It sets the environment and then becomes the command (exec), so signals and exit codes are the
command's own.  The reporter starts at interpreter start in every rank through a
`sitecustomize` put first on PYTHONPATH; variables the user already set are left alone.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Mapping

import llmmon_reporter
from llmmon.inject import trainerenv
from llmmon_reporter import identity, layout

# The only path added for the trainer: a directory holding the start-up hook alone, which loads
# the reporter from its own package directory (see boot/sitecustomize.py).
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(llmmon_reporter.__file__)), "boot")
TIMING_COST = ("adds a CUDA start event per collective for `duration_ms`; it breaks NCCL/GEMM "
               "overlap with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron, TransformerEngine; "
               "pytorch#143890) and raises the risk of a watchdog hang. Turn it on per job or "
               "on a canary subset.")


def _flag(command: list[str], *names: str) -> str | None:
    """The value of `--name value` or `--name=value` in a torchrun command line."""
    for i, word in enumerate(command):
        for name in names:
            if word == name and i + 1 < len(command):
                return command[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def resolve_job(given: str | None, env: Mapping[str, str], command: list[str]) -> str:
    """--job, the reporter's environment precedence, torchrun's --rdzv-id, its endpoint."""
    found = given or identity.job_from_env(env)
    if found:
        return found
    rdzv_id = _flag(command, "--rdzv-id", "--rdzv_id")
    if rdzv_id and rdzv_id.lower() != "none":
        return rdzv_id
    endpoint = _flag(command, "--rdzv-endpoint", "--rdzv_endpoint")
    master = _flag(command, "--master-addr", "--master_addr")
    if endpoint is None and master:
        endpoint = f"{master}:{_flag(command, '--master-port', '--master_port')}"
    if endpoint:  # every node's launcher sees the same endpoint
        return identity.rendezvous_job(endpoint)
    return f"{socket.gethostname()}-{os.getpid()}"


def environment(env: Mapping[str, str], job: str, spool: str, fr_dir: str, pipe_dir: str,
                fr_buffer: int, timing: bool, dump_on_timeout: bool,
                nccl_log: bool = True) -> dict[str, str]:
    """The command's environment: ours added, the user's own settings kept (the webhook
    applies the same function to a pod's containers)."""
    return trainerenv.environment(env, job, spool, fr_dir, pipe_dir, fr_buffer, timing,
                                  dump_on_timeout, BOOT_DIR, nccl_log)


def _prepare_dirs(env: Mapping[str, str], spool: str) -> None:
    """Create the job's dump and pipe directories; warn (never fail) when that is not possible."""
    if not os.path.isdir(spool):
        print(f"llmmon launch: spool {spool} does not exist; is the llmmon daemon running "
              "on this node? Training runs anyway, unreported.", file=sys.stderr)
    for problem in trainerenv.prepare_job_dirs(trainerenv.job_dirs(env)):
        print(f"llmmon launch: {problem}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not args.print_env:
        print("llmmon launch: no command given (llmmon launch -- torchrun ...)", file=sys.stderr)
        return 2
    job = resolve_job(args.job, os.environ, command)
    env = environment(os.environ, job, args.spool, args.fr_dir, args.pipe_dir, args.fr_buffer,
                      args.timing, not args.no_dump_on_timeout, not args.no_nccl_log)
    if args.print_env:
        for key in sorted(set(env) - set(os.environ) | {"PYTHONPATH"}):
            print(f"{key}={env[key]}")
        return 0
    _prepare_dirs(env, args.spool)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"llmmon launch: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "launch", help="Run a training command with the llmmon reporter and Flight Recorder on.",
        description="Run a training command (usually torchrun) with the llmmon reporter started "
        "in every rank and the PyTorch Flight Recorder configured: buffer size (both variable "
        "names), dump on timeout, dump file prefix and dump pipe prefix. Variables already set "
        "are kept.", epilog="example: llmmon launch --job llama-7b -- torchrun "
        "--nproc-per-node 8 train.py")
    parser.add_argument("--job", help="Job id (default: LLMMON_JOB, TORCHELASTIC_RUN_ID, "
                        "SLURM_JOB_ID, torchrun --rdzv-id, else derived from the rendezvous).")
    parser.add_argument("--spool", default=os.environ.get("LLMMON_SPOOL", layout.DEFAULT_SPOOL),
                        help="Spool directory shared with the node daemon (default: "
                        "%(default)s).")
    parser.add_argument("--fr-buffer", type=int, default=2000, metavar="N",
                        help="Flight Recorder ring size in entries (default: %(default)s).")
    parser.add_argument("--fr-dir", default=layout.DEFAULT_FR_DIR,
                        help="Where dumps are written (default: %(default)s).")
    parser.add_argument("--pipe-dir", default=layout.DEFAULT_PIPE_DIR,
                        help="Where the dump pipes are created (default: %(default)s).")
    parser.add_argument("--timing", action="store_true",
                        help=f"Set TORCH_NCCL_ENABLE_TIMING=1 for collective durations. Cost: "
                        f"{TIMING_COST}")
    parser.add_argument("--no-dump-on-timeout", action="store_true",
                        help="Do not set TORCH_NCCL_DUMP_ON_TIMEOUT=1.")
    parser.add_argument("--no-nccl-log", action="store_true",
                        help="Do not write NCCL's INFO log to a file in the dump directory (set "
                        "only when the job sets neither NCCL_DEBUG nor NCCL_DEBUG_FILE; the "
                        "daemon reads the transport NCCL chose from it).")
    parser.add_argument("--print-env", action="store_true",
                        help="Print the variables that would be set, and exit.")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="The training command, after --.")
    parser.set_defaults(func=run)
