"""The replay backend: the capture unchanged, directories, sequences, delays, hangs, reloads."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from llmmon.sources.nvml import NvmlError, XidEvent, list_gpus
from llmmon.sources.nvml_open import open_nvml
from llmmon.sources.nvml_replay import RELOAD_CHECK_S, ReplayFileError
from tests.gpu.conftest import CAPTURE, H200X8, edit


def single(tmp_path: Path, change=None) -> Path:
    path = tmp_path / "gpu.json"
    shutil.copy(CAPTURE, path)
    if change:
        edit(path, change)
    return path


def test_the_capture_loads_unchanged_with_its_shapes_and_codes() -> None:
    source = open_nvml(str(CAPTURE))
    assert source.device_count() == 1
    assert source.system("driver") == "580.159.04"
    assert source.call(0, "memory_info_v2")["reserved"] == 644939776
    assert source.call(0, "violation_status", "NVML_PERF_POLICY_LOW_UTILIZATION") == \
        {"referenceTime": 1795993107281613, "violationTime": 27747412928}
    with pytest.raises(NvmlError) as unsupported:
        source.call(0, "nvlink", "3", "state")
    assert unsupported.value.code == 3 and unsupported.value.absent
    fields = source.field_values(0, ["NVML_FI_DEV_POWER_INSTANT",
                                     "NVML_FI_DEV_NVLINK_COUNT_RAW_BER_V2"])
    assert fields["NVML_FI_DEV_POWER_INSTANT"].get() == 84937
    assert fields["NVML_FI_DEV_NVLINK_COUNT_RAW_BER_V2"].ret == 2  # unknown to this driver
    assert source.gpm(0, ["NVML_GPM_METRIC_DRAM_BW_UTIL"])[
        "NVML_GPM_METRIC_DRAM_BW_UTIL"].get() == pytest.approx(0.000387194)


def test_calls_missing_from_the_file_answer_not_supported() -> None:
    source = open_nvml(str(CAPTURE))
    for read in (lambda: source.call(0, "temp_threshold_acoustic"),
                 lambda: source.system("process_name")):
        with pytest.raises(NvmlError) as missing:
            read()
        assert missing.value.absent
    assert source.gpm(0, ["NVML_GPM_METRIC_SM_UTIL"])["NVML_GPM_METRIC_SM_UTIL"].ret == 3


def test_a_directory_is_one_gpu_per_file_in_name_order() -> None:
    gpus = list_gpus(open_nvml(str(H200X8)))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[3].uuid == "GPU-5f3c2a10-7d41-4e8b-9c62-0a1b2c3d4e53"
    assert gpus[3].pci_bus_id == "00000000:5D:00.0"
    assert gpus[3].sysfs_pci_address == "0000:5d:00.0"


def test_list_gpus_leaves_out_lost_ones(tmp_path: Path) -> None:
    path = single(tmp_path, lambda d: d["device0"].update(uuid={"code": 15,
                                                                "nvml_error": "GPU is lost"}))
    assert list_gpus(open_nvml(str(path))) == []


def test_sequences_step_per_call_and_repeat_their_last_entry(tmp_path: Path) -> None:
    path = single(tmp_path, lambda d: d["device0"].update(temp_gpu_c={"sequence": [
        {"ok": 40}, {"ok": 41}, {"nvml_error": "GPU is lost", "code": 15}]}))
    source = open_nvml(str(path))
    assert [source.call(0, "temp_gpu_c") for _ in range(2)] == [40, 41]
    for _ in range(2):
        with pytest.raises(NvmlError) as lost:
            source.call(0, "temp_gpu_c")
        assert lost.value.lost


def test_delay_and_hang_block_like_slow_and_wedged_calls(tmp_path: Path) -> None:
    path = single(tmp_path, lambda d: d["device0"].update(
        total_energy_mj={"ok": 5, "delay_s": 0.05}, temp_gpu_c={"hang": True}))
    source = open_nvml(str(path))
    started = time.monotonic()
    assert source.call(0, "total_energy_mj") == 5
    assert time.monotonic() - started >= 0.05
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: _capture(outcome, source.call, 0, "temp_gpu_c"))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive()  # hung, as a wedged driver call
    source.close()
    worker.join(5)
    assert not worker.is_alive() and isinstance(outcome[0], NvmlError)


def _capture(outcome: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: B036 - handed to the test thread
        outcome.append(exc)


@pytest.mark.parametrize("content, message", [
    ("{ not json", "invalid JSON"),
    ("[]", "expected a JSON object"),
    ('{"device0": {}, "device1": {}}', "exactly one GPU"),
    ('{"system": {}}', "exactly one GPU"),
    ('{"device0": {"temp_gpu_c": 38}}', "device0/temp_gpu_c: expected an object"),
    ('{"device0": {"temp_gpu_c": {"value": 38}}}', "device0/temp_gpu_c/value: expected an obj"),
    ('{"device0": {"temp_gpu_c": {"hang": false}}}', "device0/temp_gpu_c: expected {\"ok\""),
    ('{"device0": {"fan": {"sequence": []}}}', "sequence must be a non-empty list"),
    ('{"device0": {"fan": {"ok": 1, "delay_s": -1}}}', "delay_s must be"),
    ('{"device0": {}, "field_values": {"NVML_FI_DEV_ENERGY": {"value": 1}}}',
     "field_values/NVML_FI_DEV_ENERGY: expected an integer \"ret\""),
    ('{"device0": {}, "xid_events": [79]}', "xid_events must be a list"),
])
def test_bad_files_are_refused_with_the_file_and_key(tmp_path: Path, content: str,
                                                      message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReplayFileError, match=message) as refused:
        open_nvml(str(path))
    assert str(path) in str(refused.value)


def test_an_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplayFileError, match="no \\*.json replay files"):
        open_nvml(str(tmp_path))


def test_rewritten_files_are_reloaded_and_broken_ones_reported(tmp_path: Path) -> None:
    path = single(tmp_path)
    source = open_nvml(str(path))
    assert source.call(0, "temp_gpu_c") == 38
    edit(path, lambda d: d["device0"].update(temp_gpu_c={"ok": 77}))
    time.sleep(RELOAD_CHECK_S * 1.5)
    assert source.call(0, "temp_gpu_c") == 77
    path.write_text(json.dumps({"device0": {"temp_gpu_c": 3}}))
    time.sleep(RELOAD_CHECK_S * 1.5)
    assert source.call(0, "temp_gpu_c") == 77  # the last good answers stay
    assert "temp_gpu_c: expected an object" in source.problems()[str(path)]


def test_xid_events_are_delivered_once_and_appended_ones_later(tmp_path: Path) -> None:
    path = single(tmp_path, lambda d: d.update(xid_events=[{"xid": 79}, {"xid": 79}]))
    source = open_nvml(str(path))
    events = source.xid_event_set([0])
    assert [events.wait(0), events.wait(0), events.wait(0.05)] == \
        [XidEvent(0, 79), XidEvent(0, 79), None]
    edit(path, lambda d: d["xid_events"].append({"xid": 31}))
    assert events.wait(RELOAD_CHECK_S * 5) == XidEvent(0, 31)
