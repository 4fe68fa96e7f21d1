"""NCCL's own reading of its environment: integer parameters (strtoll), path levels and the
device-list grammar of NCCL_IB_HCA and NCCL_SOCKET_IFNAME, on near misses and hostile text."""

from __future__ import annotations

import pytest

from llmmon.network.nccl_settings import (
    ANY_PORT, MAX_IB_DEVS, MAX_IFS, MAX_VALUE, NcclSettings, nccl_int, parse_device_list,
    path_level, path_rank)


def test_from_env_reads_nccl_variables_only() -> None:
    s = NcclSettings.from_env({"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "3",
                               "NCCL_SOCKET_IFNAME": "^docker,lo", "IB_HCA": "mlx5_9",
                               "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_P2P_LEVEL": "NVL"})
    assert (s.ib_hca, s.ib_gid_index, s.socket_ifname) == ("=mlx5_0:1", "3", "^docker,lo")
    assert (s.debug_subsys, s.p2p_level, s.net_gdr_level) == ("INIT,NET", "NVL", "")


def test_from_env_bounds_hostile_values() -> None:
    s = NcclSettings.from_env({"NCCL_IB_HCA": "m" * 10**6, "NCCL_NET": None,  # type: ignore
                               "NCCL_ALGO": 7})  # type: ignore[dict-item]
    assert len(s.ib_hca) == MAX_VALUE
    assert s.net == s.algo == ""


@pytest.mark.parametrize("text, value", [
    ("", None), ("1", 1), ("0", 0), ("0x10", 16), ("017", 15), ("09", 0), (" 4", 4),
    ("4 QPs", 4), ("abc", 0), ("-1", -1), ("+2", 2), ("9" * 30, None), ("-" + "9" * 30, None),
])
def test_integers_as_strtoll_reads_them(text: str, value: int | None) -> None:
    assert nccl_int(text) == value


@pytest.mark.parametrize("text, level", [
    ("PIX", "PIX"), ("PXB", "PXB"), ("PHB", "PHB"), ("SYS", "SYS"), ("LOC", "LOC"),
    ("NVL", "NVL"), ("0", "LOC"), ("1", "PIX"), ("2", "PXB"), ("3", "PHB"), ("4", "SYS"),
    ("5", "SYS"), ("99", "SYS"), ("9" * 40, "SYS"),
    # NCCL compares names exactly and reads numbers only from a leading digit.
    ("pix", None), ("NODE", None), (" PIX", None), ("-1", None), ("", None),
])
def test_path_levels(text: str, level: str | None) -> None:
    assert path_level(text) == level


def test_path_rank_orders_topology_classes() -> None:
    ranks = [path_rank(p) for p in ("PIX", "PXB", "PHB", "NODE", "SYS")]
    assert ranks == sorted(ranks) and path_rank("NODE") == path_rank("PHB")
    assert path_rank("bogus") is None


def hca(text: str, device: str, port: int = 1) -> bool:
    return parse_device_list(text).matches(device, port)


def test_prefix_exact_and_exclusion() -> None:
    assert hca("mlx5", "mlx5_0") and hca("mlx5", "mlx5_10")
    assert hca("mlx5_1", "mlx5_10")  # a prefix, as in NCCL
    assert hca("=mlx5_1", "mlx5_1") and not hca("=mlx5_1", "mlx5_10")
    assert not hca("^mlx5_3", "mlx5_3") and hca("^mlx5_3", "mlx5_0")
    assert not hca("^mlx5_3", "mlx5_30")  # the exclusion is a prefix too
    assert hca("^=mlx5_3", "mlx5_30") and not hca("^=mlx5_3", "mlx5_3")
    # '=' before '^' is not an exclusion: NCCL looks for '^' first.
    assert not hca("=^mlx5_3", "mlx5_0")


def test_ports() -> None:
    assert hca("mlx5_0:1,mlx5_1:1", "mlx5_1", 1) and not hca("mlx5_0:1", "mlx5_0", 2)
    assert hca("mlx5_0", "mlx5_0", 2)  # no port: every port
    assert not hca("mlx5_0:x", "mlx5_0", 1)  # atoi("x") is port 0, which no port has
    assert not hca("mlx5_0:", "mlx5_0", 1)  # an empty port is atoi("") = 0 as well
    assert hca("mlx5_0:1:0:0", "mlx5_0", 1)  # rail and plane fields are ignored
    assert hca("mlx5_0:-1", "mlx5_0", 3)  # -1 is NCCL's "any port"
    assert parse_device_list("mlx5_0:1").matches("mlx5_0")  # interfaces have no port
    assert parse_device_list("mlx5_0").entries[0].port == ANY_PORT


def test_empty_lists() -> None:
    assert hca("", "mlx5_0") and hca(",,", "mlx5_0") and hca(":1", "mlx5_0")
    assert not hca("^", "mlx5_7")  # an empty exclusion matches nothing (NCCL's XOR)


def test_socket_interfaces() -> None:
    ifs = parse_device_list("^docker,lo", MAX_IFS)
    assert ifs.matches("eth0") and ifs.matches("ens1f0np0")
    assert not ifs.matches("docker0") and not ifs.matches("lo") and not ifs.matches("loop1")
    assert parse_device_list("ib").matches("ibp42s0")
    assert parse_device_list("=eth0,eth1").matches("eth1")
    assert not parse_device_list("=eth0,eth1").matches("eth10")


def test_hostile_lists_are_bounded() -> None:
    many = ",".join(f"mlx5_{i}" for i in range(10_000))
    assert len(parse_device_list(many).entries) == MAX_IB_DEVS
    assert len(parse_device_list(many, MAX_IFS).entries) == MAX_IFS
    long = parse_device_list("x" * 100 + ":" + "9" * 400)
    assert len(long.entries[0].prefix) == 63
    assert not long.matches("x" * 63, 1)
    assert str(parse_device_list("^=a:1,b")) == "^=a:1,b"
