"""The NCCL log parser over real public logs (tests/fixtures/nccl/logs, SOURCES.md) and hostile text.

Each fixture is what NCCL printed in a public issue thread; the expectations are what a reader
of that log sees.  The hostile cases check that untrusted text never raises, that its cost is
bounded, and that text which only quotes NCCL's messages does not count as NCCL's own.
"""

from __future__ import annotations

import os
import time

import pytest

from llmmon.network import nccl_log
from llmmon.network.nccl_log import NcclLog, parse
from tests.conftest import FIXTURES

LOGS = FIXTURES / "nccl" / "logs"

# file: (version, net, devices, gdr, paths)
EXPECTED: dict[str, tuple[str, str, tuple[str, ...], bool | None, set[str]]] = {
    # 2.4: no "Using network" line yet; IB finds nothing, sockets carry the traffic.
    "nccl-2.4.7-socket-no-ib.log": (
        "2.4.7", "Socket",
        ("ens3:172.31.10.182<0>", "ens3:172.31.15.113<0>", "ens3:172.31.7.247<0>",
         "ens3:172.31.15.231<0>", "ens3:172.31.3.113<0>", "ens3:172.31.10.149<0>",
         "ens3:172.31.11.73<0>"),
        None, set()),
    # 2.4 sets up sockets for bootstrap even when IB is used: IB with a device wins.
    "nccl-2.4.7-ib-with-socket-bootstrap.log": ("2.4.7", "IB", ("mlx5_0:1/IB",), None, set()),
    # A plugin in 2.4: only the ring lines name it; the socket line is bootstrap's.
    "nccl-2.4.6-aws-ofi-ring.log": (
        "2.4.6", "AWS Libfabric", (), False, {"NET/AWS Libfabric", "P2P/IPC"}),
    "nccl-2.5.6-socket-two-nics.log": (
        "", "Socket",
        ("enP1p1s0f0:10.30.0.127<0>", "enP1p1s0f1:10.30.0.227<0>",
         "enP1p1s0f0:10.30.0.129<0>", "enP1p1s0f1:10.30.0.229<0>"),
        False, {"NET/Socket"}),
    # mpirun's "[155] " before NCCL's prefix; IB and RoCE ports mixed.
    "nccl-2.5.6-ib-roce-mpirun-prefix.log": (
        "", "IB", ("mlx5_1:1/IB", "mlx5_3:1/IB", "mlx5_0:1/IB", "mlx5_2:1/RoCE", "mlx5_4:1/IB"),
        None, {"P2P/IPC"}),
    # mpirun --tag-output, the version line tagged too.
    "nccl-2.5.6-socket-loopback-tag-output.log": (
        "2.5.6", "Socket", ("lo:127.0.0.1<0>",), None, set()),
    "nccl-2.7.6-a100-ib-gdrdma.log": ("", "IB", (), True, {"NET/IB/GDRDMA"}),
    "nccl-busid-ib-gdrdma-direct-pointer.log": (
        "", "IB", (), True, {"NET/IB/GDRDMA", "P2P/direct pointer"}),
    "nccl-2.10.3-aws-ofi-efa.log": ("2.10.3", "AWS Libfabric", (), None, set()),
    "nccl-2.11.4-socket-forced.log": ("2.11.4", "Socket", ("enp225s0f1:10.10.10.2<0>",), None, set()),
    # RoCE with relaxed ordering: "[RO]" is not a device.
    "nccl-2.19.3-roce-ro.log": ("2.19.3", "IB", ("mlx5_10:1/RoCE", "mlx5_11:1/RoCE"), None, set()),
    "nccl-2.18plus-ib-gdrdma-cumem-read.log": (
        "", "IB", (), True, {"NET/IB/GDRDMA", "P2P/CUMEM"}),
    # A log shipper's columns before NCCL's prefix and before the bare version line.
    "nccl-2.21.5-cloudwatch-prefix.log": ("2.21.5", "", (), None, set()),
    "nccl-aws-ofi-h200-gdrdma.log": ("", "AWS Libfabric", (), True, {"NET/AWS Libfabric/GDRDMA"}),
    # The IBext plugin loaded, yet the channels go over sockets.
    "nccl-ibext-present-socket-ipc-read.log": ("", "Socket", (), False, {"NET/Socket", "P2P/IPC"}),
    # IBext_v8 prints NET/IB's line, with merged NICs ("[0]={[0] mlx5_2:1/RoCE, ...}").
    "nccl-ibext-v8-merged-nics.log": (
        "", "IBext_v8", ("mlx5_2:1/RoCE", "mlx5_3:1/RoCE", "mlx5_0:1/RoCE", "mlx5_1:1/RoCE"),
        False, {"NET/IBext_v8"}),
    # No channel lines, but "GPU Direct RDMA Disabled for HCA 0 'lo'".
    "nccl-socket-loopback-gdr-disabled.log": ("", "Socket", ("lo:127.0.0.1<0>",), False, set()),
    "nccl-socket-shm-direct.log": ("", "Socket", (), False, {"NET/Socket", "SHM"}),
}


def read(name: str) -> str:
    return (LOGS / name).read_bytes().decode("utf-8", errors="replace")


def test_every_fixture_has_expectations_and_a_source() -> None:
    """A fixture added without asserts, or without its public origin, fails here."""
    files = {path.name for path in LOGS.glob("*.log")}
    assert files == set(EXPECTED)
    sources = (LOGS / "SOURCES.md").read_text(encoding="utf-8")
    for name in files:
        assert f"`{name}`" in sources, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_log(name: str) -> None:
    version, net, devices, gdr, paths = EXPECTED[name]
    log = parse(read(name))
    assert (log.version, log.net, log.net_devices, log.gdr, set(log.paths)) == (
        version, net, devices, gdr, paths)
    assert log.lines > 0


def test_line_count_is_nccls_lines_only() -> None:
    """libfabric's own line is not NCCL's; the bare version line is."""
    text = read("nccl-2.10.3-aws-ofi-efa.log")
    assert len(text.splitlines()) == 18
    assert parse(text).lines == 17


def test_nothing_read() -> None:
    assert parse("") == nccl_log.EMPTY
    assert parse("just an application's output\n" * 100) == nccl_log.EMPTY
    assert parse(None) == nccl_log.EMPTY  # type: ignore[arg-type]


def test_the_last_using_network_wins_over_channels_and_device_lines() -> None:
    text = ("h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n"
            "h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\n"
            "h:1:2 [0] NCCL INFO Using network Socket\n"
            "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n")
    log = parse(text)
    assert (log.net, log.net_devices, log.gdr) == ("Socket", ("eth0:10.0.0.2<0>",), False)


def test_newer_forms() -> None:
    """2.2x: INFO version line, PXN proxy rank, (PCI) and /Shared suffixes, CUMEM/CE, NVLS, CollNet."""
    text = "\n".join([
        "[2025-01-02 03:04:05] h-1:10:20 [3] NCCL INFO NCCL version 2.27.3+cuda12.9",
        "h-1:10:20 [3] NCCL INFO Channel 01/1 : 3[3] -> 11[3] [send] via NET/IB/3(1)/GDRDMA(PCI)/Shared",
        "h-1:10:20 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/CUMEM/read/CE",
        "h-1:10:20 [3] NCCL INFO Channel 03/0 : 3[3] -> 5[5] via P2P/indirect/4[4]/read",
        "h-1:10:20 [3] NCCL INFO Channel 00 : 3[3] -> 2[2] via SHM/direct",
        "h-1:10:20 [3] NCCL INFO Ring 00 : 0[0] -> 1[1] via direct shared memory",
        "h-1:10:20 [3] NCCL INFO CollNet 00/0 : 3 [send] via COLLNET/SHARP/0/GDRDMA",
        "h-1:10:20 [3] NCCL INFO NVLS comm 0x55 headRank 0 nHeads 8 nvlsRanks 8 buffSize 1048576",
    ])
    log = parse(text)
    assert log.version == "2.27.3"
    assert set(log.paths) == {"NET/IB/GDRDMA", "P2P/CUMEM", "P2P/indirect", "SHM", "CollNet",
                              "NVLS"}
    assert (log.net, log.gdr, log.lines) == ("IB", True, 8)


def test_channels_without_gdrdma_outweigh_an_enabled_hca() -> None:
    """The HCA could do GDR, but NCCL_NET_GDR_LEVEL kept the channels off it: not used."""
    enabled = "h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'\n"
    channel = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
    assert parse(enabled).gdr is True
    assert parse(enabled + channel).gdr is False


LOOKALIKES = "\n".join([
    # prose and documentation quoting NCCL's messages
    "NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE",
    "# NCCL INFO Using network IB",
    "look for: NCCL INFO Channel 00 : 0[0] -> 1[1] via NET/IB/0/GDRDMA",
    "[0] NCCL INFO GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
    # PyTorch's error message names a version without NCCL's "+cuda"
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:410, unhandled system error, NCCL version 2.4.8",
    "see the release notes of NCCL version 2.18.1+cuda12.1 for the details of this long sentence",
    # NCCL's own lines that do not say what was chosen
    "h:1:2 [0] NCCL INFOrmation NET/IB : Using [0]mlx5_9:1/IB",
    "h:1:2 [0] NCCL INFO NCCL_NET set by environment to Socket",
    "h:1:2 [0] NCCL INFO NET/IB : No device found.",
    "h:1:2 [0] NCCL INFO NET/IB : Using [RO]; OOB eth0:10.0.4.51<0>",
    "h:1:2 [0] NCCL INFO Channel 00/02 : 0 1 2 3",
    "h:1:2 [0] NCCL INFO Ring 00 : 3 -> 0 -> 1",
    "h:1:2 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "h:1:2 [0] NCCL INFO NET/OFI Using Libfabric version 2.1",
])


def test_lookalikes_do_not_count() -> None:
    log = parse(LOOKALIKES)
    assert (log.version, log.net, log.net_devices, log.gdr, log.paths) == ("", "", (), None,
                                                                          frozenset())
    assert log.lines == 7     # only the seven lines NCCL itself printed


def test_binary_junk() -> None:
    junk = os.urandom(1 << 20).decode("utf-8", errors="replace")
    assert parse(junk).lines == 0
    mixed = junk[:5000] + "\nh:1:2 [0] NCCL INFO Using network IB\n" + junk[5000:20000]
    assert parse(mixed).net == "IB"
    assert parse("\x00\ufffd NCCL \x00 NCCL INFO \x00:1:2 [0] NCCL version \n" * 1000) is not None


def test_megabyte_lines() -> None:
    """A 1 MB line is cut, not read: what it hides past the cap does not count, and it is quick."""
    long_tail = "h:1:2 [0] NCCL INFO Using network " + "A" * (1 << 20) + "\n"
    assert len(parse(long_tail).net) == nccl_log.MAX_NAME
    buried = "x" * (1 << 20) + " h:1:2 [0] NCCL INFO Using network IB\n"
    spam = "NCCL " * (1 << 18) + "\n"
    started = time.perf_counter()
    assert parse(buried).net == ""
    assert parse(spam).lines == 0
    assert time.perf_counter() - started < 0.5


def test_fifty_megabyte_stream_is_bounded() -> None:
    """Read head and tail only: the first version and the newest net both survive, within caps."""
    line = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
    text = ("NCCL version 2.18.5+cuda12.2\n" + line * (50_000_000 // len(line))
            + "h:1:2 [0] NCCL INFO Using network Socket\n")
    started = time.perf_counter()
    log = parse(text)
    elapsed = time.perf_counter() - started
    assert (log.version, log.net, log.paths) == ("2.18.5", "Socket", frozenset({"P2P/IPC"}))
    assert log.lines <= nccl_log.MAX_LINES
    assert elapsed < 1.0


def test_sets_stay_bounded() -> None:
    many = "".join(f"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/n{i}/0\n"
                   f"h:1:2 [0] NCCL INFO NET/IB : Using [{i}]mlx5_{i}:1/IB\n" for i in range(500))
    log = parse(many + "h:1:2 [0] NCCL INFO Using network IB\n")
    assert len(log.paths) == nccl_log.MAX_PATHS
    assert len(log.net_devices) == nccl_log.MAX_DEVICES


def test_one_mebibyte_of_real_log_is_fast() -> None:
    """The collector parses every rank's log each run: 1 MiB of NCCL lines in well under 100 ms."""
    real = "".join(read(name) for name in sorted(EXPECTED))
    text = (real * ((1 << 20) // len(real) + 1))[: 1 << 20]
    best = min(_timed(text) for _ in range(3))
    assert best < 0.1, best


def _timed(text: str) -> float:
    started = time.perf_counter()
    log = parse(text)
    elapsed = time.perf_counter() - started
    assert isinstance(log, NcclLog) and log.lines > 10_000
    return elapsed


def test_what_nccl_says_it_applied_is_read_from_real_logs() -> None:
    """NCCL's ENV lines show the settings it applied (the environment and /etc/nccl.conf);
    integer settings end in a full stop that is not part of the value."""
    def applied(name: str) -> dict[str, str]:
        return dict(parse((LOGS / name).read_text(errors="replace")).applied)

    assert applied("nccl-socket-loopback-gdr-disabled.log") == {
        "NCCL_IBEXT_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    assert applied("nccl-2.4.7-ib-with-socket-bootstrap.log") == {"NCCL_IB_DISABLE": "0"}
    assert applied("nccl-2.21.5-cloudwatch-prefix.log") == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert applied("nccl-2.19.3-roce-ro.log") == {}
    fake = "\n".join(f"h:1:1 [0] NCCL INFO NCCL_X{i} set by environment to v{i}."
                     for i in range(500))
    assert len(parse(fake).applied) == 64 and dict(parse(fake).applied)["NCCL_X0"] == "v0."
