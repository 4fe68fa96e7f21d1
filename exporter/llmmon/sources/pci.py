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


# current_link_speed / max_link_speed as the kernel prints them (PCIE_SPEED2STR) -> generation.
_GENERATIONS = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


def parse_link_speed(text: str) -> int | None:
    """`32.0 GT/s PCIe` -> 5; None for `Unknown` (link down) and speeds no generation has."""
    return _GENERATIONS.get(text.split(" ", 1)[0])


def link(sysfs: RootedFS, *device: str) -> dict[str, int]:
    """The PCIe link files of a device that are present and known: each LINK_FILES name ->
    generation (speeds) or lanes (widths).  Raises SourceError on a file that cannot be read
    or parsed; a device without these files (virtual functions) yields {}."""
    values = {}
    for name in LINK_FILES:
        if not sysfs.exists(*device, name):
            continue
        text = sysfs.read_value(*device, name)
        if name.endswith("speed"):
            generation = parse_link_speed(text)
            if generation is not None:
                values[name] = generation
        elif text.isdigit():
            values[name] = int(text)
        else:
            raise SourceError(f"{sysfs.path(*device, name)}: not a link width: {text[:40]!r}")
    return values


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
