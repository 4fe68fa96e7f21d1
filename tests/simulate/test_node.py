"""Simulated nodes as the real collectors read them: clean, realistic, monotonic, switchable."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from llmmon.collectors.gpu import GpuCollector
from llmmon.simulate.cluster import Cluster, ClusterConfig
from llmmon.simulate.control import SpecError, parse, parse_lines
from llmmon.simulate.runner import Simulation
from llmmon.simulate.scenarios import SCENARIOS
from tests.conftest import ROOT
from tests.core.helpers import make_collector
from tests.simulate.conftest import Exposition, expose

HARDWARE = ("llmmon_gpu_", "llmmon_rdma_", "llmmon_nic_", "llmmon_netdev_", "llmmon_disk_",
            "llmmon_pressure_")


def ticked(work: Path, *specs: str, seconds: int = 3, **config: object) -> Cluster:
    """A cluster run for `seconds` ticks of simulated wall time from now."""
    cluster = Cluster(work, ClusterConfig(**config))  # type: ignore[arg-type]
    now = time.time()
    cluster.set_scenarios([parse(s) for s in specs], now)
    for second in range(seconds + 1):
        cluster.tick(now + second)
    return cluster


def test_healthy_node_reads_cleanly_with_h200_magnitudes(work: Path) -> None:
    node = ticked(work).nodes[0]
    exposed = expose(node)
    watched = {name: state["watched"] for name, state in exposed.collectors.items()}
    # incidents and nccl run before ranks here: no verdict to watch yet
    assert watched == {"disk": 6, "gpu": 8, "incidents": 0, "nccl": 0, "netdev": 9, "nic": 8,
                       "ranks": 8, "rdma": 8, "topology": 64}
    assert {name: state["errors_total"] for name, state in exposed.collectors.items()} == \
        dict.fromkeys(watched, 0)
    assert all(600 < watts < 760 for watts in exposed.values("llmmon_gpu_power_watts"))
    assert exposed.values("llmmon_gpu_power_limit_watts") == [700.0] * 8
    assert exposed.values("llmmon_rdma_port_rate_bytes_per_second") == [5e10] * 8
    assert exposed.values("llmmon_rdma_port_up") == [1.0] * 8
    assert exposed.value("llmmon_gpudirect_rdma_enabled") == 1
    for gpu in node.layout.gpus:
        nic = node.layout.nics[gpu.index]
        assert exposed.value("llmmon_gpu_nearest_nic_info", gpu=str(gpu.index),
                             device=nic.device, netdev=nic.netdev, path="PIX") == 1
        assert exposed.value("llmmon_rank_info", rank=str(gpu.index), uuid=gpu.uuid,
                             job_id="pretrain-0", world_size="8") == 1
        pod = [dict(labels)["pod_uid"] for (name, labels) in exposed.samples
               if name == "llmmon_gpu_process_info" and dict(labels)["gpu"] == str(gpu.index)]
        assert pod == [node.pod_uid("pretrain-0-sim-00")]
    assert exposed.value("llmmon_torch_memory_reserved_bytes", rank="0") == 100 * 2**30
    assert exposed.value("llmmon_training_steps_total", rank="0") >= 1
    assert len(exposed.samples) < 3000


def test_every_scenario_in_turn_keeps_hardware_counters_increasing(work: Path) -> None:
    cluster = Cluster(work, ClusterConfig(speed=50))
    now = time.time()
    previous: Exposition | None = None
    # The daemon counts the lost GPU, and the restarted job's ranks whose old files are
    # still fresh, as problems: what it must do; anything else is a bad simulated file.
    phases = [([], {}), (["pfc-storm", "link-flap:every=60", "thermal"], {}),
              (["starvation", "oom"], {}), (["fp16", "straggler"], {}), (["hang"], {}),
              (["gpu-lost"], {"gpu": "GPU 2 .* is lost"}),
              ([], {"ranks": "rank 0 is also reported by pid 42000"})]
    for phase, (specs, problems) in enumerate(phases):
        cluster.set_scenarios([parse(s) for s in specs], now + 4 * phase)
        for second in range(4):
            cluster.tick(now + 4 * phase + second + 1)
        exposed = expose(cluster.nodes[0])
        for name, state in exposed.collectors.items():
            if name in problems:
                assert re.search(problems[name], state["last_error"]), state
            else:
                assert state["errors_total"] == 0, state
        if previous is not None:
            for key, value in exposed.samples.items():
                name = key[0]
                if name.startswith(HARDWARE) and name.endswith("_total") and \
                        key in previous.samples:
                    assert value >= previous.samples[key], (specs, key)
        previous = exposed


def test_control_file_switches_scenarios_and_survives_bad_input(
        work: Path, caplog: pytest.LogCaptureFixture) -> None:
    simulation = Simulation(work, ClusterConfig(), [])
    node = simulation.cluster.nodes[0]
    reason = {"gpu": "1", "reason": "hw_thermal_slowdown"}
    assert expose(node).value("llmmon_gpu_clock_event_active", **reason) == 0

    simulation.control.path.write_text("# a card runs hot\nthermal@sim-00:gpu=1\n")
    simulation.step(time.time())
    assert expose(node).value("llmmon_gpu_clock_event_active", **reason) == 1

    simulation.control.path.write_text("thermal@sim-00:gpu=1\nmeltdown\n")
    with caplog.at_level(logging.ERROR, "llmmon.simulate"):
        simulation.step(time.time())
    assert "unknown scenario 'meltdown'" in caplog.text
    assert [a.spec.text for a in simulation.cluster.active] == ["thermal@sim-00:gpu=1"]

    simulation.control.path.write_text("")
    simulation.step(time.time())
    assert expose(node).value("llmmon_gpu_clock_event_active", **reason) == 0


@pytest.mark.parametrize("specs, message", [
    (["meltdown"], "unknown scenario 'meltdown'; known: healthy, starvation"),
    (["thermal@sim-07"], "no node 'sim-07'"),
    (["thermal:gpu=8"], "thermal: gpu=8: the node has 8 GPUs"),
    (["pfc-storm:vlan=3"], "pfc-storm: unknown parameter(s) vlan (known: period, port)"),
    (["hang:rank=12"], "hang: rank 12 of job pretrain-0 does not run on this node"),
])
def test_bad_specs_are_refused_with_the_reason(work: Path, specs: list[str],
                                               message: str) -> None:
    cluster = Cluster(work, ClusterConfig())
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cluster.set_scenarios([parse(s) for s in specs], time.time())


def test_spec_syntax() -> None:
    assert parse("thermal@sim-01:gpu=3").text == "thermal@sim-01:gpu=3"
    assert [s.name for s in parse_lines("hang  # stuck\n\n oom:oom=60 \n")] == ["hang", "oom"]
    for bad in ("hang@", "oom:oom", "oom:oom=soon", "Hang!"):
        with pytest.raises(SpecError):
            parse(bad)
    with pytest.raises(SpecError, match="line 2"):
        parse_lines("hang\noom:=3\n")


def test_hang_names_the_rank_that_never_enqueued(work: Path) -> None:
    exposed = expose(ticked(work, "hang").nodes[0])
    (job,) = exposed.ranks["jobs"]
    (group,) = job["groups"]
    assert group["behind"] == [5]
    assert group["waiting"] == [0, 1, 2, 3, 4, 6, 7]
    assert exposed.value("llmmon_nccl_last_enqueued_seq", rank="5") < \
        exposed.value("llmmon_nccl_last_enqueued_seq", rank="0")
    assert all(watts < 150 for watts in exposed.values("llmmon_gpu_power_watts"))


def test_gpu_lost_answers_gpu_is_lost_and_the_job_stops_reporting(work: Path) -> None:
    cluster = ticked(work, "gpu-lost:after=2")
    exposed = expose(cluster.nodes[0])
    assert exposed.value("llmmon_gpu_up", gpu="2") == 0
    assert sorted(exposed.values("llmmon_gpu_up")) == [0.0] + [1.0] * 7
    assert not cluster.jobs[0].alive


def test_speed_compresses_the_oom_timeline(work: Path) -> None:
    slow = ticked(work / "slow", "oom:oom=60", seconds=5)
    fast = ticked(work / "fast", "oom:oom=60", seconds=5, speed=20)
    assert expose(slow.nodes[0]).value("llmmon_torch_ooms_total", rank="1") == 0
    assert expose(fast.nodes[0]).value("llmmon_torch_ooms_total", rank="1") == 1


def test_starved_gpus_dip_at_20_hz(work: Path) -> None:
    """The replayed instant power carries the real trace's starved pattern: the GPU
    collector's 20 Hz sampler counts a dip a second and ~60 % of the time below the low
    level, while the 1 s average hides it."""
    node = ticked(work, "starvation").nodes[0]
    collector = make_collector(GpuCollector, node.paths.procfs, node.paths.sysfs,
                               settings={"nvml.replay": str(node.paths.nvml)})
    try:
        collector.power.track(0, 700.0)
        for sample in range(40):  # two seconds at 20 Hz
            collector.power.tick(sample * 0.05)
        window = collector.power.take(0)
    finally:
        collector.close()
    assert window is not None and window.dips_total in (1, 2, 3)
    assert 0.8 < (window.low_seconds_total or 0) < 1.6
    assert window.min_watts < 200 < 600 < window.max_watts


def test_docs_describe_every_scenario_and_parameter() -> None:
    text = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    for name, cls in SCENARIOS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")),
                   None)
        assert row is not None, f"docs/simulate.md has no row for {name}"
        for parameter in [*cls.defaults, *cls.optional]:
            assert f"`{parameter}`" in row, f"{name}: parameter {parameter} undocumented"
        for alert in cls.alerts:
            assert alert in row, f"{name}: alert {alert} undocumented"


def test_the_ring_size_is_a_knob_and_survives_a_restart(work: Path) -> None:
    """`--ring N`: each rank's Flight Recorder dump holds the last N records once full (the
    soak's 2,000-record rings), and a restarted process keeps the size."""
    from llmmon.simulate.spool_files import ring

    cluster = ticked(work, seconds=20, ring=7, speed=20)
    job = cluster.jobs[0]
    rank = job.ranks[0]
    entries = ring(job, rank)["entries"]
    assert len(entries) == 7, len(entries)
    assert [e["record_id"] for e in entries] == sorted(e["record_id"] for e in entries)
    rank.restart(rank.pid + 1)
    assert rank.ring.maxlen == 7 and not rank.ring
    with pytest.raises(ValueError, match="ring"):
        ClusterConfig(ring=0)
