"""The directories training processes and the daemon share: the rank spool, the Flight Recorder
dump pipes and the dumps. The real systemd-sysusers and systemd-tmpfiles make them from the
shipped snippets (bare metal, and the generated copy for Kubernetes nodes); then they are used
across users as on a node: a trainer started by the real `llmmon launch` (umask 022, its FIFO
made the way torch makes it), the daemon's real dump request through a read-only mount, its
real harvest and pruning; and the spool's age clean-up."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from tests.deploy.deploy_helpers import ROOT, Child, fork_as, require
from llmmon.cli import build_parser
from llmmon.ranks.dumps import MARKER, DumpKeeper, request

SYSTEMD_TMPFILES = ROOT / "deploy" / "systemd" / "llmmon.tmpfiles.conf"
NODE_TMPFILES = ROOT / "deploy" / "kubernetes" / "node" / "llmmon.tmpfiles.conf"
SYSUSERS = ROOT / "deploy" / "systemd" / "llmmon.sysusers.conf"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
TRAINER = 4242  # a training user: neither root nor the daemon
JOB = "llm-pretrain"
DAY = 86400
# torch's side, as ProcessGroupNCCL does it: mkfifo(<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe,
# 0666), so the trainer's umask applies; on each byte, a dump to <..._TEMP_FILE><rank>.
FAKE_TORCH = """
set -e
pipe="${TORCH_NCCL_DEBUG_INFO_PIPE_FILE}0.pipe"
mkfifo "$pipe"
exec 3<>"$pipe"
echo ready
for n in 1 2; do
  dd bs=1 count=1 <&3 >/dev/null 2>&1
  echo "{\\"dump\\": $n}" > "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}0"
  echo "dumped $n"
done
"""


@pytest.fixture
def node() -> Iterator[Path]:
    """An empty root directory other users can enter (pytest's own tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="llmmon-node-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def tmpfiles(root: Path, action: str) -> None:
    """systemd-tmpfiles under root, user names looked up in root's /etc/passwd as on the
    node itself (--root alone would ask this machine's)."""
    script = ('mount --bind "$1/etc/passwd" /etc/passwd && mount --bind "$1/etc/group" '
              '/etc/group && exec "$2" "$3" --root="$1"')
    out = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(root),
                          require("systemd-tmpfiles"), action],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr  # a skipped ACL only warns


def make_dirs(root: Path, snippet: str) -> int:
    """systemd-sysusers, then systemd-tmpfiles --create with `snippet`; llmmon's uid."""
    for folder, text in (("sysusers.d", SYSUSERS.read_text()), ("tmpfiles.d", snippet)):
        (root / "etc" / folder).mkdir(parents=True, exist_ok=True)
        (root / "etc" / folder / "llmmon.conf").write_text(text)
    out = subprocess.run([require("systemd-sysusers"), f"--root={root}"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tmpfiles(root, "--create")
    user = next(line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines()
                if line.startswith("llmmon:"))
    assert user[6] == "/usr/sbin/nologin"
    return int(user[2])


def default_acl(path: Path) -> set[tuple[int, int, int]]:
    """(tag, permissions, id) of each entry of the directory's default ACL (the kernel's
    system.posix_acl_default layout: a 4-byte version, then 8-byte entries)."""
    data = os.getxattr(path, "system.posix_acl_default")
    return {struct.unpack_from("<HHI", data, offset) for offset in range(4, len(data), 8)}


ACL_USER = 2  # a named user entry
RWX = 7


def daemon_uid() -> int:
    return yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"][
        "securityContext"]["runAsUser"]


def test_sysusers_and_tmpfiles_make_the_user_and_shared_directories(node):
    uid = make_dirs(node, SYSTEMD_TMPFILES.read_text())
    for path, mode in (("run/llmmon", 0o755), ("run/llmmon/ranks", 0o1777),
                       ("run/llmmon/frpipe", 0o1777), ("var/lib/llmmon", 0o755),
                       ("var/lib/llmmon/fr", 0o1777)):
        info = os.stat(node / path)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, 0), path
    for path in ("run/llmmon/frpipe", "var/lib/llmmon/fr"):  # the daemon's way in
        assert (ACL_USER, RWX, uid) in default_acl(node / path)
    with pytest.raises(OSError):
        default_acl(node / "run/llmmon/ranks")  # the daemon reads 0644 files: no ACL needed


def test_kubernetes_node_copy_names_the_daemonsets_user(node):
    make_dirs(node, NODE_TMPFILES.read_text())
    assert daemon_uid() == 65534
    for path in ("run/llmmon/frpipe", "var/lib/llmmon/fr"):
        assert (ACL_USER, RWX, 65534) in default_acl(node / path)


def launcher(root: Path) -> Callable[[], int]:
    """The trainer: the real `llmmon launch` (job directories, torch's variables), then torch.
    Parsed here: the trainer's user may not read this interpreter's site-packages."""
    args = build_parser().parse_args([
        "launch", "--job", JOB, "--spool", str(root / "run/llmmon/ranks"),
        "--fr-dir", str(root / "var/lib/llmmon/fr"),
        "--pipe-dir", str(root / "run/llmmon/frpipe"), "--", "sh", "-c", FAKE_TORCH])

    def run() -> int:
        os.environ.clear()
        os.environ.update(PATH="/usr/bin:/bin", LLMMON_REPORTER="0")
        return args.func(args)  # execs sh; returns only if it could not

    return run


def _ask(pipes: Path) -> dict:
    """The daemon's dump request, through its read-only mount of the pipe directory."""
    try:
        os.mkfifo(pipes / "probe")
        refused = ""
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
    return {"refused": refused, "ranks": request(str(pipes), JOB, [0])}


@pytest.mark.parametrize("case", ["systemd", "kubernetes-node", "without-acl"])
def test_daemon_asks_for_moves_and_prunes_dumps_of_another_users_job(node, case):
    snippet = (NODE_TMPFILES if case == "kubernetes-node" else SYSTEMD_TMPFILES).read_text()
    if case == "without-acl":  # the control: modes alone do not let the daemon in
        snippet = "\n".join(line for line in snippet.splitlines() if not line.startswith("a+"))
    llmmon = make_dirs(node, snippet)
    daemon = daemon_uid() if case == "kubernetes-node" else llmmon
    pipes, dumps = node / "run/llmmon/frpipe", node / "var/lib/llmmon/fr"

    def ask() -> dict:
        return fork_as(daemon, daemon, lambda: _ask(pipes), read_only=[pipes]).result()

    def harvest(now: float) -> int:
        return fork_as(daemon, daemon,
                       lambda: DumpKeeper(str(dumps), keep=1, settle=0.0).harvest(now)).result()

    trainer: Child = fork_as(TRAINER, TRAINER, launcher(node))
    try:
        assert trainer.line() == "ready"
        fifo = os.stat(pipes / JOB / "rank_0.pipe")
        assert stat.S_ISFIFO(fifo.st_mode) and fifo.st_uid == TRAINER
        answer = ask()
        assert answer["refused"] == "EROFS"  # the mount is read-only, yet the pipe opens
        if case == "without-acl":
            assert answer["ranks"] == {"0": "Permission denied"}
            return
        assert answer["ranks"] == {"0": "requested"}
        assert trainer.line() == "dumped 1"
        assert harvest(time.time()) == 1
        assert ask()["ranks"] == {"0": "requested"}
        assert trainer.line() == "dumped 2"
        assert harvest(time.time() + 5) == 1  # a second set: the first is pruned
        trainer.wait()
    finally:
        trainer.kill()
    (kept,) = (dumps / JOB).iterdir()
    assert kept.name.startswith("dump-") and os.stat(kept).st_uid == daemon
    # the rank's dump, and the marker that says the daemon made this set (its retention counts
    # only such sets)
    assert sorted(p.name for p in kept.iterdir()) == [MARKER, "rank_0"]
    assert os.stat(kept / MARKER).st_uid == daemon
    assert (kept / "rank_0").read_text() == '{"dump": 2}\n'


def test_clean_ages_out_what_crashed_ranks_left_and_nothing_else(node):
    make_dirs(node, SYSTEMD_TMPFILES.read_text())
    old = time.time() - 2 * DAY
    spool = node / "run/llmmon/ranks"
    crashed = [spool / "job-a" / "rank_3.77.json", spool / "job-a" / "rank_3.77.entries.json"]
    live = spool / "job-a" / "rank_0.80.json"
    pipe = node / "run/llmmon/frpipe/job-a/rank_0.pipe"  # a long job never asked for a dump
    kept = node / "var/lib/llmmon/fr/job-a/dump-20261101T000000Z/rank_0"
    for path in (*crashed, live, pipe, kept):
        path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(pipe)
    for path in (*crashed, live, kept):
        path.write_text("{}")
    for path in (*crashed, pipe, kept, pipe.parent, kept.parent, kept.parent.parent):
        os.utime(path, (old, old))
    tmpfiles(node, "--clean")
    assert [p for p in crashed if p.exists()] == []
    assert live.exists() and stat.S_ISFIFO(os.stat(pipe).st_mode) and kept.exists()
