"""GPU-to-NIC placement over sysfs trees of an HGX-like node, the classic misconfiguration
(every NIC on socket 0) and a one-host-bridge workstation, checked against the matrix
`nvidia-smi topo -m` prints for each layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmmon.collector import Context
from llmmon.collectors.topology import TopologyCollector
from llmmon.exposition import render
from tests.conftest import FIXTURES, compare_golden
from tests.core.helpers import make_collector, run

LAYOUTS = FIXTURES / "topology"
H200X8 = str(FIXTURES / "nvml" / "h200x8")  # NVML replay of 8 GPUs at the HGX bus ids
OPTIONS = {"hgx": {"settings": {"nvml.replay": H200X8}, "affinity_matrix": True},
           "misconfigured": {"nvml": False, "affinity_matrix": True},
           "workstation": {"nvml": False, "affinity_matrix": True}}


def collector(sysfs: Path, **options: object) -> TopologyCollector:
    return make_collector(TopologyCollector, FIXTURES / "proc", sysfs, **options)


def nvidia_smi_matrix(layout: str) -> dict[tuple[str, str], str]:
    """(gpu index, RDMA device) -> path class, from the GPU rows of `nvidia-smi topo -m`."""
    lines = (LAYOUTS / layout / "nvidia-smi-topo-m.txt").read_text().splitlines()
    columns = lines[0].split("\t")[1:]
    legend = dict(line.strip().split(": ") for line in lines if line.startswith("  NIC"))
    matrix = {}
    for line in lines[1:]:
        cells = line.split("\t")
        if not cells[0].startswith("GPU"):
            continue
        for column, cell in zip(columns, cells[1:]):
            if column.startswith("NIC"):
                matrix[(cells[0][3:], legend[column])] = cell
    return matrix


@pytest.mark.parametrize("layout", sorted(OPTIONS))
def test_golden_exposition(layout: str) -> None:
    c = collector(LAYOUTS / layout / "sys", **OPTIONS[layout])
    compare_golden(f"topology-{layout}.prom", render(c.collect(Context()))[0].decode())


@pytest.mark.parametrize("layout", sorted(OPTIONS))
def test_classification_matches_nvidia_smi(layout: str) -> None:
    samples, ctx, _ = run(collector(LAYOUTS / layout / "sys", **OPTIONS[layout]))
    assert ctx.error_count == 0
    ours = {(dict(l)["gpu"], dict(l)["device"]): dict(l)["path"]
            for n, l in samples if n == "llmmon_gpu_nic_affinity"}
    assert ours == nvidia_smi_matrix(layout)


def test_affinity_matrix_is_off_by_default() -> None:
    """Without the flag only the nearest NIC per GPU is exported (it still says SYS)."""
    samples, _, _ = run(collector(LAYOUTS / "misconfigured" / "sys", nvml=False))
    assert not [n for n, _ in samples if n == "llmmon_gpu_nic_affinity"]
    assert len(nearest(samples)) == 8
    assert "SYS" in {p for _, _, p in nearest(samples).values()}


def nearest(samples: dict) -> dict[str, tuple[str, str, str]]:
    return {dict(l)["gpu"]: (dict(l)["device"], dict(l)["netdev"], dict(l)["path"])
            for n, l in samples if n == "llmmon_gpu_nearest_nic_info"}


def test_hgx_rails_and_gpudirect() -> None:
    samples, ctx, _ = run(collector(LAYOUTS / "hgx" / "sys", settings={"nvml.replay": H200X8}))
    assert ctx.watched == 64  # 8 GPUs x 8 NICs; the NVSwitches are not GPUs
    # Two GPUs and two NICs per switch: one NIC each, as NCCL spreads them.
    assert {g: d for g, (d, _, p) in nearest(samples).items() if p == "PIX"} == {
        str(i): f"mlx5_{i}" for i in range(8)}
    assert nearest(samples)["1"][1] == "ibp43s0"
    uuids = {dict(l)["gpu"]: dict(l)["uuid"] for n, l in samples
             if n == "llmmon_gpu_nearest_nic_info"}
    assert uuids["7"] == "GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e57"  # named by NVML
    assert samples[("llmmon_gpudirect_rdma_enabled", ())] == 1


def test_misconfigured_node_shows_sys_and_no_gpudirect() -> None:
    samples, _, _ = run(collector(LAYOUTS / "misconfigured" / "sys", nvml=False))
    paths = {g: p for g, (_, _, p) in nearest(samples).items()}
    assert paths == {**{str(g): "NODE" for g in range(4)}, **{str(g): "SYS" for g in range(4, 8)}}
    assert samples[("llmmon_gpudirect_rdma_enabled", ())] == 0


def test_legacy_peer_memory_module(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(LAYOUTS / "misconfigured" / "sys", tree, symlinks=True)
    (tree / "module" / "nv_peer_mem").mkdir()
    samples, _, _ = run(collector(tree, nvml=False))
    assert samples[("llmmon_gpudirect_rdma_enabled", ())] == 1


def test_workstation_pxb_and_phb() -> None:
    samples, _, _ = run(collector(LAYOUTS / "workstation" / "sys", nvml=False))
    assert nearest(samples) == {"0": ("mlx5_0", "enp6s0np0", "PXB"),
                                "1": ("mlx5_1", "enp8s0np0", "PHB")}


def test_nothing_to_watch_without_gpus_or_nics() -> None:
    samples, ctx, _ = run(collector(FIXTURES / "sys", nvml=False))  # NICs, no GPUs
    assert samples == {} and ctx.error_count == 0 and ctx.watched == 0


def test_nvml_gpus_missing_from_sysfs_are_reported() -> None:
    samples, ctx, _ = run(collector(LAYOUTS / "workstation" / "sys", settings={"nvml.replay": H200X8}))
    assert samples == {}
    assert len(ctx.errors) == 8
    assert "is --path.sysfs the host's?" in ctx.errors["0000:18:00.0"]


PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Release Build  "
               "(dvs-builder@U16-I3-B03-4-3)  Tue Jul  8 18:05:34 UTC 2025\n")


@pytest.mark.parametrize("release, driver, expected", [
    (None, None, 1),  # the fixture: Linux 6.8 with the open GPU kernel module
    ("5.11.0-49-generic\n", None, 0),  # a kernel without RDMA dma-buf
    (None, PROPRIETARY, 0),  # the proprietary module exports no dma-buf
])
def test_dmabuf_support_without_peer_memory(tmp_path: Path, release: str | None,
                                            driver: str | None, expected: int) -> None:
    proc = Path(shutil.copytree(LAYOUTS / "dmabuf" / "proc", tmp_path / "proc"))
    if release is not None:
        (proc / "sys/kernel/osrelease").write_text(release)
    if driver is not None:
        (proc / "driver/nvidia/version").write_text(driver)
    topology = make_collector(TopologyCollector, proc, LAYOUTS / "misconfigured" / "sys",
                              nvml=False)
    samples, ctx, _ = run(topology)
    assert samples[("llmmon_gpudirect_rdma_enabled", ())] == 0  # no nvidia_peermem
    assert samples[("llmmon_gpudirect_dmabuf_supported", ())] == expected
