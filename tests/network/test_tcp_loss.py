"""TCP counters of the ranks' network namespaces: the real /proc/net/snmp and netstat shapes
(captured on Linux 6.18), read through a rank's /proc/<pid>, one namespace read once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from llmmon.ranks.liveness import Process
from llmmon.ranks.netns import HOST, Member, TcpWatch
from llmmon.sources import tcpstats
from llmmon.sources.fs import RootedFS, SourceError
from tests.conftest import FIXTURES

CAPTURE = FIXTURES / "proc" / "net"


def _tcp(text: str) -> dict[str, int]:
    names, values = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    return dict(zip(names, map(int, values)))


def _rank_proc(proc: Path, pid: int, ns: str, sent: int = 0, retransmitted: int = 0) -> None:
    """A rank's /proc/<pid>: the captured net files with Tcp's counters moved by the given
    amounts, and ns/net pointing at `ns` (readlink reads a link that resolves nowhere)."""
    net = proc / str(pid) / "net"
    net.mkdir(parents=True, exist_ok=True)
    shutil.copy(CAPTURE / "netstat", net / "netstat")
    text = (CAPTURE / "snmp").read_text()
    tcp = _tcp(text)
    header, values = [line for line in text.splitlines() if line.startswith("Tcp:")]
    moved = {"OutSegs": tcp["OutSegs"] + sent, "RetransSegs": tcp["RetransSegs"] + retransmitted}
    new = "Tcp: " + " ".join(str(moved.get(n, v)) for n, v in tcp.items())
    (net / "snmp").write_text(text.replace(values, new))
    (proc / str(pid) / "ns").mkdir(exist_ok=True)
    link = proc / str(pid) / "ns" / "net"
    if link.is_symlink():
        link.unlink()
    os.symlink(ns, link)


def _first_value(text: str, value: str) -> str:
    lines = text.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("Tcp:")][1]
    lines[at] = " ".join(["Tcp:", value] + lines[at].split()[2:])
    return "\n".join(lines)


def _member(rank: int, pid: int, pod: str, visible: bool = True) -> Member:
    return Member(rank, pid, pod, Process(start_ticks=1, visible=visible))


def test_the_captured_files_parse_to_their_own_numbers(tmp_path: Path) -> None:
    _rank_proc(tmp_path, 41, "net:[4026532301]")
    stats = tcpstats.read(RootedFS(str(tmp_path)), 41)
    tcp = _tcp((CAPTURE / "snmp").read_text())
    ext_names, ext_values = [line.split() for line in (CAPTURE / "netstat").read_text()
                             .splitlines() if line.startswith("TcpExt:")]
    assert stats.sent == tcp["OutSegs"] and stats.retransmitted == tcp["RetransSegs"]
    assert stats.timeouts == int(ext_values[ext_names.index("TCPTimeouts")])
    assert tcpstats.namespace(RootedFS(str(tmp_path)), 41) == "net:[4026532301]"


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.replace("RetransSegs", "Retrans Segs", 1), r"Tcp block is not a header"),
    (lambda t: _first_value(t, "N/A"),
     r"Tcp RtoAlgorithm is not a number: 'N/A'"),
    (lambda t: "\n".join(line for line in t.splitlines() if not line.startswith("Tcp:")),
     r"no Tcp OutSegs, RetransSegs"),
])
def test_a_malformed_snmp_file_is_an_error_that_names_the_file_and_field(
        tmp_path: Path, damage, message: str) -> None:
    _rank_proc(tmp_path, 41, "net:[1]")
    snmp = tmp_path / "41" / "net" / "snmp"
    snmp.write_text(damage(snmp.read_text()))
    with pytest.raises(SourceError, match=message) as error:
        tcpstats.read(RootedFS(str(tmp_path)), 41)
    assert str(snmp) in str(error.value)


def test_without_netstat_the_retransmissions_still_count(tmp_path: Path) -> None:
    _rank_proc(tmp_path, 41, "net:[1]", sent=10)
    (tmp_path / "41" / "net" / "netstat").unlink()
    stats = tcpstats.read(RootedFS(str(tmp_path)), 41)
    assert stats.timeouts is None and stats.sent == _tcp((CAPTURE / "snmp").read_text())[
        "OutSegs"] + 10


def test_each_namespace_is_read_once_named_by_its_pod_and_its_loss_is_over_the_window(
        tmp_path: Path) -> None:
    # ranks 0 and 1 share pod a's namespace; rank 2 is alone in pod b's; rank 3's pid is not
    # trusted by the PID watch (another process may hold the number): never read
    for pid, ns in ((10, "net:[100]"), (11, "net:[100]"), (12, "net:[200]"), (13, "net:[300]")):
        _rank_proc(tmp_path, pid, ns)
    members = [_member(1, 11, "pod-a"), _member(0, 10, "pod-a"), _member(2, 12, "pod-b"),
               _member(3, 13, "pod-c", visible=False)]
    watch = TcpWatch(RootedFS(str(tmp_path)))
    assert watch.read({"job": members}, 1000.0) == []
    assert [(job, netns) for job, netns, _ in watch.series()] == [("job", "pod-a"),
                                                                   ("job", "pod-b")]
    assert watch.loss("job", 1000.0, 30.0) is None  # one sample: no window yet
    _rank_proc(tmp_path, 10, "net:[100]", sent=1000, retransmitted=5)
    _rank_proc(tmp_path, 12, "net:[200]", sent=2000, retransmitted=300)
    watch.read({"job": members}, 1010.0)
    loss = watch.loss("job", 1010.0, 30.0)
    assert loss is not None
    assert (loss.netns, loss.sent, loss.retransmitted) == ("pod-b", 2000, 300)
    assert loss.share == pytest.approx(0.15) and loss.seconds == 10.0
    # samples older than the window leave it
    watch.read({"job": members}, 1035.0)
    loss = watch.loss("job", 1035.0, 30.0)
    assert loss is not None and (loss.retransmitted, loss.seconds) == (0, 25.0)


def test_one_unreadable_rank_is_an_error_and_the_others_are_still_read(tmp_path: Path) -> None:
    _rank_proc(tmp_path, 10, "net:[100]")
    _rank_proc(tmp_path, 12, "net:[200]")
    (tmp_path / "12" / "net" / "snmp").write_text("Tcp: garbage\n")
    watch = TcpWatch(RootedFS(str(tmp_path)))
    problems = watch.read({"job": [_member(0, 10, "pod-a"), _member(2, 12, "pod-b")],
                           "gone": [_member(0, 99, "pod-z")]}, 1.0)
    assert [key for key, _ in problems] == ["tcp/job/2", "tcp/gone/0"]
    assert "Tcp block is not a header" in problems[0][1]
    assert "99/ns/net" in problems[1][1]
    assert [netns for _, netns, _ in watch.series()] == ["pod-a"]


def test_the_daemons_own_namespace_is_host_and_a_reset_counter_is_no_loss(tmp_path: Path) -> None:
    own = os.readlink("/proc/self/ns/net")
    _rank_proc(tmp_path, 10, own, sent=5000, retransmitted=500)
    watch = TcpWatch(RootedFS(str(tmp_path)))
    watch.read({"job": [_member(0, 10, "pod-a")]}, 1.0)
    assert [netns for _, netns, _ in watch.series()] == [HOST]
    _rank_proc(tmp_path, 10, own)  # counters went back (a namespace re-created under the id)
    watch.read({"job": [_member(0, 10, "pod-a")]}, 6.0)
    assert watch.loss("job", 6.0, 30.0) is None
