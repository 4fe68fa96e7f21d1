"""Support bundles: the raw inputs this node's collectors read, in one archive, and replaying it.

`capture()` writes a tar.gz holding, under `llmmon-capture/`:

- `sys/`: from --path.sysfs, what the rdma, netdev, nic and topology collectors read: every
  RDMA device (identity, port state, rate, link layer, netdev, `counters/`, `hw_counters/`),
  every network interface (operstate, carrier changes, MTU, speed), the NVIDIA GPUs of
  `bus/pci/devices`, the PCI functions behind them, and the GPUDirect modules.  Symlinks are
  kept as the relative links sysfs has, so the PCIe paths (PIX ... SYS) replay unchanged.
  Devices a collector excludes (device_include/device_exclude) are not read;
- `proc/`: diskstats, pressure/io, the nfs collector's mountstats and the cgroup file of every
  GPU process (pod attribution);
- `nvml/`: an NVML snapshot of every GPU in the replay format (`llmmon.sources.nvml_snapshot`);
- `ethtool/`: `ethtool -S` text per interface (copied dumps, or read live);
- `netlink.json`: the `ip -s -s -j link show` shape (copied, or read live over rtnetlink);
- `spool/`: the rank spool files, with their modification times;
- `manifest.json`: when, where, which collectors were on, and what could not be read.

`replay_settings()` unpacks one (refusing members that would land outside its directory) and
points the settings at it, so `llmmon serve --replay ARCHIVE` serves the captured node.  Spool
files are re-dated so each rank is as old as it was at capture.  Lines that depend on when they
are read differ between the live and the replayed exposition: `VOLATILE` lists them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

from llmmon import __version__
from llmmon.collector import Environment
from llmmon.collectors.nic import NicCollector
from llmmon.collectors.rdma import RdmaCollector
from llmmon.config import Settings
from llmmon.sources import infiniband, pci
from llmmon.sources.ethtool import HEADER, DumpDirectory, Ioctl, StatisticsSource
from llmmon.sources.fs import SKELETONS, RootedFS, SourceError
from llmmon.sources.netlink import IpJsonDump, Rtnetlink
from llmmon.sources.nvml import NvmlError, NvmlUnavailable
from llmmon.sources.nvml_open import open_nvml
from llmmon.sources.nvml_snapshot import write_snapshots
from llmmon.sources.spool import SpoolSource

FORMAT = 1
TOP = "llmmon-capture"
MAX_FILE_BYTES = 1 << 20
# What replay unpacks at most: a capture holds text files of MAX_FILE_BYTES, spool files (16 MiB
# each at the ranks collector's default) and NVML snapshots; a real one is a few MiB.
MAX_MEMBER_BYTES = 64 << 20
MAX_UNPACKED_BYTES = 512 << 20
MAX_MEMBERS = 100_000
PCI_ATTRIBUTES = ("class", "vendor", "device", "numa_node")
RDMA_ATTRIBUTES = ("hca_type", "fw_ver", "board_id", "node_type")
PORT_ATTRIBUTES = ("state", "phys_state", "rate", "link_layer", "lid", "sm_lid",
                   "gid_attrs/ndevs/0")
NETDEV_ATTRIBUTES = ("operstate", "carrier_changes", "mtu", "speed")
MODULES = ("nvidia", "nvidia_peermem", "nv_peer_mem")
# Exposition lines that depend on the moment they are read, not on the captured inputs:
# run times, ages and clock readings, and the 20 Hz instant-power window (a snapshot holds
# one instant reading).  XID counts are events, not state: a snapshot cannot hold them.
VOLATILE = (
    r"llmmon_exporter_collector_(duration_seconds|last_success_timestamp_seconds)\{",
    r"llmmon_gpu_power_instant_(watts|min_watts|min_ratio|mean_watts|max_watts|samples_total)\{",
    r"llmmon_gpu_power_(dips|low_seconds)_total\{",
    r"llmmon_rank_report_age_seconds\{",
    r"llmmon_nccl_(last_progress_timestamp_seconds|group_last_progress_timestamp_seconds|"
    r"oldest_inflight_age_seconds|quiet_seconds)\{",
)


class CaptureError(ValueError):
    """An archive that cannot be replayed, with the reason (a ValueError, as bad settings are)."""


class _Copier:
    """Copies sysfs paths into the capture, re-creating the symlinks met on the way."""

    def __init__(self, source: RootedFS, dest: Path, problems: list[str]) -> None:
        self.source = source
        self.dest = dest
        self.problems = problems

    def _resolve(self, relative: str) -> str | None:
        """`relative` with its symlinks followed (each copied as a link); None if missing."""
        current = ""
        for part in relative.strip("/").split("/"):
            candidate = os.path.join(current, part)
            path = self.source.path(candidate)
            if os.path.islink(path):
                target = os.readlink(path)
                if os.path.isabs(target):
                    return None  # sysfs links are relative; anything else is not ours to copy
                link = self.dest / candidate
                link.parent.mkdir(parents=True, exist_ok=True)
                if not os.path.lexists(link):
                    os.symlink(target, link)
                current = os.path.normpath(os.path.join(current, target))
                if current.startswith(".."):
                    return None
            elif os.path.exists(path):
                current = candidate
            else:
                return None
        return current

    def file(self, relative: str) -> None:
        real = self._resolve(relative)
        if real is None or not os.path.isfile(self.source.path(real)):
            return
        try:
            data = self.source.read_text(real, max_bytes=MAX_FILE_BYTES)
        except SourceError as exc:
            if "Invalid argument" not in str(exc):  # e.g. `speed` of a down link: absent
                self.problems.append(str(exc))
            return
        target = self.dest / real
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data, encoding="utf-8")

    def link(self, relative: str) -> None:
        """A symlink itself (e.g. `driver`), kept even when it dangles in the capture."""
        directory, name = os.path.split(relative.rstrip("/"))
        real = self._resolve(directory)
        if real is None or not os.path.islink(self.source.path(real, name)):
            return
        link = self.dest / real / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(os.readlink(self.source.path(real, name)), link)

    def directory(self, relative: str) -> None:
        real = self._resolve(relative)
        if real is not None:
            (self.dest / real).mkdir(parents=True, exist_ok=True)

    def pci_function(self, *relative: str) -> None:
        base = "/".join(relative)
        for name in PCI_ATTRIBUTES:
            self.file(f"{base}/{name}")
        self.link(f"{base}/driver")


def _sysfs(settings: Settings, sysfs: RootedFS, dest: Path, problems: list[str]) -> None:
    copier = _Copier(sysfs, dest, problems)
    env = Environment(sysfs, sysfs, settings.values)
    rdma = RdmaCollector(env, settings.collectors["rdma"])
    for device in infiniband.devices(sysfs):
        if not rdma.wanted(device):
            continue
        base = f"{infiniband.CLASS}/{device}"
        for name in RDMA_ATTRIBUTES:
            copier.file(f"{base}/{name}")
        copier.pci_function(base, "device")
        for netdev in sysfs.listdir(base, "device", "net"):
            copier.directory(f"{base}/device/net/{netdev}")
        for port in infiniband.ports(sysfs, device):
            for name in PORT_ATTRIBUTES:
                copier.file(f"{base}/ports/{port}/{name}")
            for group in ("counters", "hw_counters"):
                for name in sysfs.listdir(base, "ports", port, group):
                    copier.file(f"{base}/ports/{port}/{group}/{name}")
    for netdev in sysfs.listdir("class/net"):
        for name in NETDEV_ATTRIBUTES:
            copier.file(f"class/net/{netdev}/{name}")
        copier.pci_function("class/net", netdev, "device")
    for address in pci.nvidia_gpus(sysfs):
        copier.pci_function("bus/pci/devices", address)
    for module in MODULES:
        copier.file(f"module/{module}/initstate")
        copier.file(f"module/{module}/refcnt")


def _procfs(settings: Settings, procfs: RootedFS, dest: Path, pids: list[int],
            problems: list[str]) -> None:
    names = ["diskstats", "pressure/io", settings.collectors["nfs"]["mountstats"]]
    names += [f"{pid}/cgroup" for pid in pids]
    for name in names:
        if not procfs.exists(name):
            continue
        try:
            data = procfs.read_text(name, max_bytes=16 << 20)
        except SourceError as exc:
            problems.append(str(exc))
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data, encoding="utf-8")


def _nvml(settings: Settings, dest: Path, problems: list[str]) -> list[int]:
    """Snapshot every GPU; the PIDs of their compute processes."""
    try:
        source = open_nvml(settings["nvml.replay"])
    except ValueError as exc:
        problems.append(f"nvml: {exc}")
        return []
    try:
        paths = write_snapshots(source, dest)
    except NvmlUnavailable as exc:
        problems.append(f"nvml: no NVML here ({exc})")
        return []
    except NvmlError as exc:
        problems.append(f"nvml: {exc}")
        return []
    finally:
        source.close()
    pids = []
    for path in paths:
        procs = json.loads(path.read_text(encoding="utf-8"))["device0"]["compute_procs"]
        pids += [p["pid"] for p in procs.get("ok") or []]
    return pids


def _ethtool(settings: Settings, sysfs: RootedFS, dest: Path, problems: list[str]) -> None:
    config = settings.collectors["nic"]
    nic = NicCollector(Environment(sysfs, sysfs, settings.values), config)
    source: StatisticsSource = (DumpDirectory(config["dumps"]) if config["dumps"]
                                else Ioctl(sysfs, config["all_interfaces"]))
    dest.mkdir(parents=True, exist_ok=True)
    try:
        interfaces = [i for i in source.interfaces() if nic.wanted(i)]
    except SourceError as exc:
        problems.append(str(exc))
        return
    for interface in interfaces:
        if config["dumps"]:  # the dump as it is, odd lines included
            shutil.copyfile(os.path.join(config["dumps"], interface), dest / interface)
            continue
        try:
            stats = source.read(interface)
        except SourceError as exc:
            problems.append(str(exc))
            continue
        lines = [HEADER] + [f"     {name}: {value}" for name, value in stats.values]
        (dest / interface).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _netlink(settings: Settings, dest: Path, problems: list[str]) -> None:
    dump = settings.collectors["netdev"]["dump"]
    try:
        links = IpJsonDump(dump).links() if dump else Rtnetlink().links()
    except SourceError as exc:
        problems.append(str(exc))
        return
    entries = []
    for link in links:
        entry: dict[str, Any] = {"ifname": link.name}
        if link.stats is not None:
            entry["stats64"] = {direction: {key.removeprefix(f"{direction}_"): value
                                            for key, value in link.stats.items()
                                            if key.startswith(f"{direction}_")}
                                for direction in ("rx", "tx")}
            for key, direction in (("multicast", "rx"), ("collisions", "tx")):
                if key in link.stats:
                    entry["stats64"][direction][key] = link.stats[key]
        entries.append(entry)
    dest.write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")


def copy_regular(path: str, target: Path, max_bytes: int) -> None:
    """Copy `path` only if it is a regular file when opened, never through a link: other users
    write the spool, and a file swapped for a link between the listing and the copy must not
    carry a file they cannot read into the bundle.  OSError says why it was not copied."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        data = source.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{path}: larger than {max_bytes} bytes")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def _spool(settings: Settings, dest: Path, problems: list[str]) -> None:
    config = settings.collectors["ranks"]
    source = SpoolSource(config["spool_dir"], config["max_file_bytes"], config["max_files"],
                         config["max_files_per_job"])
    for spool_file in source.scan().files:
        target = dest / os.path.basename(spool_file.job_dir) / os.path.basename(spool_file.path)
        try:
            copy_regular(spool_file.path, target, config["max_file_bytes"])
        except OSError as exc:
            problems.append(f"spool: {exc}")


def _skeleton(root: Path) -> None:
    """The directories every root has, empty where nothing under them was read: the replayed
    trees are roots of their own, not a wrong --path.sysfs or --path.procfs."""
    for kind, where in (("sysfs", "sys"), ("procfs", "proc")):
        for entry in SKELETONS[kind]:
            if entry.endswith("/"):
                (root / where / entry).mkdir(parents=True, exist_ok=True)


def capture(settings: Settings, output: Path) -> dict[str, Any]:
    """Write the archive; returns its manifest.  Unreadable parts are listed, not fatal."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="llmmon-capture-") as scratch:
        root = Path(scratch) / TOP
        sysfs, procfs = RootedFS(settings["path.sysfs"]), RootedFS(settings["path.procfs"])
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("sysfs", lambda: _sysfs(settings, sysfs, root / "sys", problems)),
            ("nvml", lambda: _nvml(settings, root / "nvml", problems)),
            ("ethtool", lambda: _ethtool(settings, sysfs, root / "ethtool", problems)),
            ("netlink", lambda: _netlink(settings, root / "netlink.json", problems)),
            ("spool", lambda: _spool(settings, root / "spool", problems)),
        ]
        root.mkdir()
        pids: list[int] = []
        for name, step in steps:
            try:
                result = step()
            except OSError as exc:
                problems.append(f"{name}: {exc}")
                continue
            if name == "nvml":
                pids = result
        _procfs(settings, procfs, root / "proc", pids, problems)
        _skeleton(root)
        manifest = {
            "format": FORMAT, "llmmon": __version__, "host": socket.gethostname(),
            "captured_at": time.time(),
            "collectors": {name: config["enabled"]
                           for name, config in settings.collectors.items()},
            "gpus": len(list((root / "nvml").glob("*.json"))),
            "problems": problems,
        }
        (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n",
                                            encoding="utf-8")
        output.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(output, "w:gz") as tar:
            tar.add(root, arcname=TOP)
    return manifest


@dataclass(frozen=True)
class Manifest:
    """What replay needs of a capture's manifest.json, checked: a bundle is a file from
    elsewhere, and a wrong type must be a one-line refusal, not a traceback."""

    captured_at: float
    collectors: dict[str, bool]
    gpus: int

    @classmethod
    def parse(cls, doc: Any, archive: str) -> Manifest:
        def bad(why: str) -> CaptureError:
            return CaptureError(f"{archive}: not a usable llmmon capture: manifest.json {why}")

        if not isinstance(doc, dict):
            raise bad("is not an object")
        if doc.get("format") != FORMAT:
            raise CaptureError(f"{archive}: capture format {doc.get('format')!r}, "
                               f"this llmmon reads {FORMAT}")
        captured_at, collectors, gpus = (doc.get(k) for k in ("captured_at", "collectors",
                                                              "gpus"))
        if isinstance(captured_at, bool) or not isinstance(captured_at, (int, float)) \
                or not 0 <= captured_at < float("inf"):
            raise bad(f"captured_at is {captured_at!r}, not a time in seconds")
        if not isinstance(collectors, dict) or not all(
                isinstance(k, str) and isinstance(v, bool) for k, v in collectors.items()):
            raise bad("collectors is not an object of collector names to true or false")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise bad(f"gpus is {gpus!r}, not a count")
        return cls(float(captured_at), dict(collectors), gpus)


def _check_members(tar: tarfile.TarFile, archive: str) -> None:
    """Refuse an archive that would unpack past the caps, before anything is written."""
    count = total = 0
    for member in tar:
        count += 1
        total += member.size
        if count > MAX_MEMBERS or member.size > MAX_MEMBER_BYTES or total > MAX_UNPACKED_BYTES:
            raise CaptureError(
                f"{archive}: larger than a capture can be ({MAX_MEMBERS} members, "
                f"{MAX_MEMBER_BYTES >> 20} MiB a member, {MAX_UNPACKED_BYTES >> 20} MiB in all)")


def unpack(archive: str, into: Path) -> tuple[Path, Manifest]:
    """Extract safely (tarfile's `data` filter: nothing outside `into`, no devices; the caps
    above: a bounded disk)."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            _check_members(tar, archive)
            tar.extractall(into, filter="data")
        root = into / TOP
        doc = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, tarfile.TarError, ValueError) as exc:
        if isinstance(exc, CaptureError):
            raise
        raise CaptureError(f"{archive}: not a usable llmmon capture: {exc}") from None
    return root, Manifest.parse(doc, archive)


def _redate_spool(spool: Path, captured_at: float) -> None:
    """Keep each spool file as old, relative to now, as it was at capture."""
    shift = time.time() - captured_at
    for path in spool.rglob("*"):
        if path.is_file():
            stat = path.stat()
            os.utime(path, (stat.st_atime + shift, stat.st_mtime + shift))


def replay_settings(archive: str, settings: Settings, into: str) -> Settings:
    """`settings` pointed at `archive` unpacked into `into` (which the caller removes), with the
    collectors the node ran."""
    root, manifest = unpack(archive, Path(into))
    _redate_spool(root / "spool", manifest.captured_at)
    values = dict(settings.values, **{
        "path.sysfs": str(root / "sys"), "path.procfs": str(root / "proc"),
        "nvml.replay": str(root / "nvml") if manifest.gpus else ""})
    collectors = copy.deepcopy(settings.collectors)
    overrides = {"nic": {"dumps": str(root / "ethtool")},
                 "netdev": {"dump": str(root / "netlink.json")},
                 "ranks": {"spool_dir": str(root / "spool"), "fr_dir": str(root / "fr"),
                           "pipe_dir": str(root / "frpipe"), "auto_dump": False}}
    for name, config in collectors.items():
        config.update(overrides.get(name, {}))
        config["enabled"] = manifest.collectors.get(name, False)
    if not manifest.gpus and "gpu" in collectors:
        collectors["gpu"]["enabled"] = False  # the real NVML here is not the captured node's
    return Settings(values, collectors)

