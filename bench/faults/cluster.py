"""Two simulated nodes on one machine: daemons, Prometheus, Alertmanager, and torchrun jobs.

Each node is a directory (spool, Flight Recorder dumps, dump pipes) with its own unmodified
`llmmon serve` at default settings; Prometheus scrapes both with the labels a DaemonSet's
service discovery would give (`node`, `cluster`) and loads the shipped rules unchanged;
Alertmanager routes with the shipped tree (group_wait/interval unchanged) to a local webhook.
A job is two `torchrun --nnodes 2` launches, one per node, each in its own network namespace;
the namespaces are joined by a veth pair, so a tc qdisc on it degrades exactly the traffic
between the nodes.  Under `llmmon launch` (the reporter in every rank), or plain (`reporter`
off): torchrun from a virtual environment that holds torch only (bench/faults/torchvenv.py),
as a job whose owners never heard of llmmon.  Each node's daemon and jobs share a PID
namespace of their own (bench/faults/pidns.py): a daemon sees its node's processes only, as on
a real node, which is what finding ranks without the reporter needs.  Everything started here
is stopped by PID (torchrun's process group, every rank's PID, every PID left in the job's
namespaces, each node's PID namespace), and the namespaces are deleted, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.faults.pidns import PidNamespace
from bench.faults.torchvenv import torch_only_venv
from llmmon.simulate import stack
from llmmon_reporter import identity
from llmmon.simulate.exporters import free_port, stop_process

CHECKOUT = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).with_name("trainer.py")
NODES = ("node-a", "node-b")
CLUSTER = "bench"
# Namespaces of this run (the pid keeps concurrent runs apart; veth names stay under 16 bytes).
NS_PREFIX = f"lf{os.getpid() % 4096:03x}"
MASTER_PORT = 29400
SCRAPE = "15s"  # deploy/prometheus/prometheus.yml's scrape and evaluation interval


def pythonpath() -> str:
    """This checkout's code first (its source folders, then the checkout for bench and tests),
    then the caller's own path (where a device run put the exporter's dependencies)."""
    ours = [str(CHECKOUT / "exporter"), str(CHECKOUT / "reporter"), str(CHECKOUT)]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and p not in ours]
    return os.pathsep.join([*ours, *inherited])


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Node:
    name: str
    root: Path
    ns: PidNamespace
    url: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def fr_dir(self) -> Path:
        return self.root / "fr"

    @property
    def pipe_dir(self) -> Path:
        return self.root / "frpipe"

    @property
    def incidents(self) -> Path:
        return self.root / "incidents"


@dataclass
class Cluster:
    """The daemons and the alerting stack; a context manager that stops all of it."""

    work: Path
    names: tuple[str, ...] = NODES
    alerting: bool = True  # Prometheus and Alertmanager too (the H200 variant has neither)
    reporter: bool = True  # jobs under `llmmon launch`; off: plain torchrun, torch only
    nodes: list[Node] = field(default_factory=list)
    python: str = sys.executable  # the jobs' interpreter (plain: the torch-only venv's)
    servers: list[stack.ServiceProcess] = field(default_factory=list)
    receiver: stack.WebhookReceiver | None = None

    @property
    def prometheus(self) -> str:
        return self.servers[1].url

    @property
    def local(self) -> bool:
        """One node (the H200 variant): no network namespaces, torchrun --standalone."""
        return len(self.names) == 1

    def __enter__(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": pythonpath()}
        if self.local and not self.reporter:
            raise ValueError("jobs without the reporter run over two nodes (their job id is "
                             "their rendezvous endpoint's)")
        if not self.reporter:
            self.python = str(torch_only_venv(self.work / "torch-only"))
        targets = []
        for name in self.names:
            node = Node(name, self.work / name, PidNamespace().__enter__())
            self.nodes.append(node)
            for path in (node.spool, node.fr_dir, node.pipe_dir):
                path.mkdir(parents=True, exist_ok=True)
            port = free_port("127.0.0.1")
            node.url = f"http://127.0.0.1:{port}"
            with open(node.root / "serve.log", "ab") as log:
                node.process = subprocess.Popen(node.ns.command(
                    [sys.executable, "-m", "llmmon", "serve",
                     f"--web.listen-address=127.0.0.1:{port}", f"--spool.dir={node.spool}",
                     f"--collector.ranks.fr-dir={node.fr_dir}",
                     f"--collector.ranks.pipe-dir={node.pipe_dir}",
                     f"--collector.incidents.dir={node.incidents}",
                     f"--collector.incidents.node={name}"]),
                    env=env, cwd=node.root, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
            targets.append({"targets": [f"127.0.0.1:{port}"],
                            "labels": {"node": name, "cluster": CLUSTER}})
        for node in self.nodes:
            self._wait_ready(node)
        if not self.alerting:
            return
        (self.work / "targets.json").write_text(json.dumps(targets))
        self.receiver = stack.WebhookReceiver()
        prometheus_bin = stack.find_binary("prometheus")
        alertmanager_bin = stack.find_binary("alertmanager", "prometheus-alertmanager")
        if not (prometheus_bin and alertmanager_bin):
            raise stack.StackError("prometheus and prometheus-alertmanager must be installed")
        self.servers.append(stack.start_alertmanager(
            alertmanager_bin, self.work / "alertmanager",
            stack.alertmanager_config(self.receiver.url)))
        self.servers.append(stack.start_prometheus(
            prometheus_bin, self.work / "prometheus",
            stack.prometheus_config(self.work / "targets.json", stack.rules_dir(self.work, None),
                                    self.servers[0].url.removeprefix("http://"), SCRAPE)))

    @staticmethod
    def _wait_ready(node: Node, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert node.process is not None
            if node.process.poll() is not None:
                raise RuntimeError(f"llmmon serve for {node.name} exited: "
                                   f"{(node.root / 'serve.log').read_text()[-2000:]}")
            try:
                get_json(node.url + "/api/v1/ranks", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"llmmon serve for {node.name} not ready after {timeout:.0f} s")

    def __exit__(self, *exc: object) -> None:
        for server in reversed(self.servers):
            server.stop()
        for node in self.nodes:
            if node.process is not None:
                stop_process(node.process)
            node.ns.__exit__()
        if self.receiver is not None:
            self.receiver.close()

    def incidents(self) -> dict[str, list[dict[str, Any]]]:
        """Each node's incidents as it wrote them (summary.json), oldest first."""
        out: dict[str, list[dict[str, Any]]] = {}
        for node in self.nodes:
            found = []
            for path in sorted(node.incidents.glob("*/summary.json")):
                try:
                    found.append(json.loads(path.read_text()))
                except (OSError, ValueError):
                    continue
            out[node.name] = found
        return out

    def ranks(self) -> dict[str, dict[str, Any]]:
        """Each node's /api/v1/ranks (a node that does not answer is left out)."""
        out = {}
        for node in self.nodes:
            try:
                out[node.name] = get_json(node.url + "/api/v1/ranks")
            except (OSError, ValueError):
                continue
        return out


def remove_namespaces(prefix: str = NS_PREFIX) -> None:
    """Namespaces this bench created (its prefix): kill what runs in them, then delete them."""
    listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
    for name in (line.split()[0] for line in listed if line.strip()):
        if name.startswith(prefix):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                kill_pid(int(pid))
            sh("ip", "netns", "del", name, check=False)


@dataclass
class Job:
    """One fault class's job over both nodes; a context manager that always cleans up."""

    cluster: Cluster
    job_id: str
    index: int  # unique per bench run: namespace names and addresses
    nproc: tuple[int, ...]
    trainer_args: list[str]
    work: Path = field(init=False)
    launches: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work = self.cluster.work / self.job_id
        self.ctl.mkdir(parents=True, exist_ok=True)

    @property
    def ctl(self) -> Path:
        return self.work / "ctl"

    def ns(self, node: int) -> str:
        return f"{NS_PREFIX}{self.index}{'ab'[node]}"

    def veth(self, node: int) -> str:
        return f"{NS_PREFIX}{self.index}{'ab'[node]}v"

    @property
    def monitored_id(self) -> str:
        """The job id the daemons give the job: its own under `llmmon launch`; without the
        reporter, the one both sides derive from its rendezvous endpoint (nothing set)."""
        if self.cluster.reporter:
            return self.job_id
        return identity.rendezvous_job(f"{self.address(0)}:{MASTER_PORT}")

    def pod(self, node: int) -> str:
        return f"{self.job_id}-{NODES[node]}"

    def address(self, node: int) -> str:
        return f"10.231.{self.index}.{node + 1}"

    def _network(self) -> None:
        for node in (0, 1):
            sh("ip", "netns", "add", self.ns(node))
            sh("ip", "-n", self.ns(node), "link", "set", "lo", "up")
        sh("ip", "link", "add", self.veth(0), "netns", self.ns(0), "type", "veth",
           "peer", "name", self.veth(1), "netns", self.ns(1))
        for node in (0, 1):
            sh("ip", "-n", self.ns(node), "addr", "add", f"{self.address(node)}/24", "dev",
               self.veth(node))
            sh("ip", "-n", self.ns(node), "link", "set", self.veth(node), "up")

    def degrade(self, qdiscs: tuple[str, ...]) -> str:
        """Degrade the link between the nodes, both directions, with the first of `qdiscs` the
        kernel has (a container's kernel may lack sch_netem); returns the one used."""
        errors = []
        for spec in qdiscs:
            done = [sh("ip", "netns", "exec", self.ns(node), "tc", "qdisc", "add", "dev",
                       self.veth(node), "root", *spec.split(), check=False) for node in (0, 1)]
            if all(result.returncode == 0 for result in done):
                return spec
            errors += [r.stderr.strip() for r in done if r.returncode]
            for node in (0, 1):
                sh("ip", "netns", "exec", self.ns(node), "tc", "qdisc", "del", "dev",
                   self.veth(node), "root", check=False)
        raise RuntimeError(f"no qdisc of {qdiscs} could be added: {errors}")

    def __enter__(self) -> Job:
        try:
            if not self.cluster.local:
                self._network()
            for node, nproc in enumerate(self.nproc):
                self._launch(node, nproc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _launch(self, node: int, nproc: int) -> None:
        where = self.cluster.nodes[node]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMMON_", "TORCH"))}
        env.update(PYTHONPATH=pythonpath(), OMP_NUM_THREADS="1", POD_NAMESPACE=CLUSTER)
        torchrun = [self.cluster.python, "-m", "torch.distributed.run",
                    "--nproc-per-node", str(nproc)]
        if self.cluster.reporter:
            launch = [sys.executable, "-m", "llmmon", "launch", "--job", self.job_id,
                      "--spool", str(where.spool), "--fr-dir", str(where.fr_dir),
                      "--pipe-dir", str(where.pipe_dir), "--", *torchrun]
        else:  # only the checkout's bench package on the path: the trainer and its mesh jobs
            env.update(PYTHONPATH=str(CHECKOUT))
            launch = torchrun
        trainer = [str(TRAINER), "--ctl", str(self.ctl), *self.trainer_args]
        if self.cluster.local:
            command = where.ns.command([*launch, "--standalone", *trainer])
        else:
            env.update(GLOO_SOCKET_IFNAME=self.veth(node))
            # Its own UTS namespace too: the hostname (the reporter's `pod`) is the node's pod,
            # and HOSTNAME, as a container runtime sets it (a daemon reads it from outside).
            # Into the node's PID namespace after the network one: `ip netns exec` finds the
            # network namespaces among the host's mounts.
            command = ["ip", "netns", "exec", self.ns(node), *where.ns.command([
                "unshare", "--uts", "sh", "-c", 'hostname "$0" && HOSTNAME="$0" exec "$@"',
                self.pod(node), *launch, "--nnodes", "2", "--node-rank", str(node),
                "--master-addr", self.address(0), "--master-port", str(MASTER_PORT), *trainer],
                mount=False)]
        with open(self.work / f"{where.name}.log", "ab") as log:
            self.launches.append(subprocess.Popen(
                command, env=env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True))

    def rank_pids(self) -> dict[int, int]:
        """Each rank's pid on this machine (the ranks write theirs as their node's PID
        namespace numbers it)."""
        pids = {}
        for path in self.ctl.glob("pid.*"):
            try:
                rank, pid = int(path.suffix[1:]), int(path.read_text())
            except ValueError:
                continue
            for node in self.cluster.nodes:
                host = node.ns.host_pid(pid)
                try:
                    if host is not None and str(self.ctl).encode() in Path(
                            f"/proc/{host}/cmdline").read_bytes():
                        pids[rank] = host
                except OSError:
                    continue
        return pids

    def steps(self) -> dict[int, int]:
        """The steps each rank has done, as it last wrote them (every rank writes its count
        into the control directory: jobs without the reporter report none to the daemon)."""
        out = {}
        for path in self.ctl.glob("step.*"):
            try:
                out[int(path.suffix[1:])] = int(path.read_text())
            except (OSError, ValueError):
                continue
        return out

    def onset(self) -> float | None:
        """The earliest fault onset a rank wrote (Unix time)."""
        times = [float(p.read_text()) for p in self.ctl.glob("onset.*") if p.read_text().strip()]
        return min(times) if times else None

    def ended(self) -> bool:
        return all(p.poll() is not None for p in self.launches)

    def __exit__(self, *exc: object) -> None:
        for launch in self.launches:
            if launch.poll() is None:
                try:
                    os.killpg(launch.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    kill_pid(launch.pid)
        for pid in self.rank_pids().values():
            try:  # still one of this job's trainers, not a PID reused since
                mine = str(self.ctl).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if mine:
                kill_pid(pid)
        for launch in self.launches:
            try:
                launch.wait(30)
            except subprocess.TimeoutExpired:
                pass
        if not self.cluster.local:
            remove_namespaces(f"{NS_PREFIX}{self.index}a")
            remove_namespaces(f"{NS_PREFIX}{self.index}b")
