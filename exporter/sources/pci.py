"""PCI devices under sysfs: where a device sits in the PCIe tree, its NUMA node and driver.

A device's place is the real path of its sysfs directory,
`devices/pci0000:15/0000:15:01.0/0000:16:00.0/.../0000:18:00.0`: the host bridge, then every
bridge on the way down, then the device itself.  That is all `nvidia-smi topo -m` needs to
tell PIX from PXB, PHB, NODE and SYS.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from llmmon.sources.fs import RootedFS, SourceError

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers; NVSwitches are bridges (0x0680)
_BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciPath:
    """A device's host bridge and the chain of PCI functions from the root port down to it."""

    root: str
    chain: tuple[str, ...]

    @property
    def address(self) -> str:
        return self.chain[-1]


def locate(sysfs: RootedFS, *parts: str) -> PciPath | None:
    """The PCI place of the device a sysfs link points at; None for virtual devices."""
    real = os.path.realpath(sysfs.path(*parts))
    relative = os.path.relpath(real, os.path.realpath(sysfs.path("devices")))
    segments = relative.split(os.sep)
    if relative.startswith("..") or len(segments) < 2 or not _BDF.match(segments[-1]):
        return None
    chain = tuple(s for s in segments[1:] if _BDF.match(s))
    return PciPath(segments[0], chain)


def numa_node(sysfs: RootedFS, *device: str) -> int:
    """NUMA node of the device at that sysfs path; -1 when the platform does not say."""
    try:
        return sysfs.read_int(*device, "numa_node")
    except SourceError:
        return -1


def driver(sysfs: RootedFS, *parts: str) -> str:
    """Name of the driver bound to a device (`device/driver` link), '' when unbound."""
    try:
        return os.path.basename(sysfs.readlink(*parts, "driver"))
    except SourceError:
        return ""


def nvidia_gpus(sysfs: RootedFS) -> list[str]:
    """PCI addresses of NVIDIA GPUs in bus order, which is NVML's default index order."""
    found = []
    for address in sysfs.listdir("bus/pci/devices"):
        try:
            vendor = sysfs.read_value("bus/pci/devices", address, "vendor")
            klass = sysfs.read_value("bus/pci/devices", address, "class")
        except SourceError:
            continue  # a device without identity files is no GPU we can place
        if vendor == NVIDIA and klass.startswith(GPU_CLASSES):
            found.append(address)
    return sorted(found)
