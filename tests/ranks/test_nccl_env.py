"""The NCCL variables a reporter sends are hostile input: only NCCL_* names, bounded, and a
document without them is a rank whose reporter sent none (an older one), not one with none."""

from __future__ import annotations

import json

import pytest

from llmmon.ranks.validate import MAX_NCCL_VARIABLES, Notes, SchemaError, parse_state
from llmmon_reporter.identity import MAX_NCCL_VALUE, nccl_env
from llmmon_reporter.layout import SCHEMA


def state(**identity: object) -> bytes:
    who = {"job_id": "j", "rank": 0, "local_rank": 0, "world_size": 2, "pod": "p",
           "namespace": "", "pid": 42, "uuid": "", "gpu_name": "", "allocator_config": "",
           **identity}
    return json.dumps({"schema": SCHEMA, "kind": "state", "written_ns": 1,
                       "identity": who, "reporter": {}}).encode()


def test_the_reporter_sends_only_its_nccl_variables_bounded() -> None:
    env = {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_TOKEN_LIKE": "x" * 4000, "HOME": "/root",
           **{f"NCCL_X{i:03d}": "1" for i in range(100)}}
    sent = nccl_env(env)
    assert "HOME" not in sent and sent["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert len(sent) == 64 and all(len(v) <= MAX_NCCL_VALUE for v in sent.values())


def test_the_daemon_keeps_nccl_names_only_and_tells_absent_from_empty() -> None:
    sent = {"NCCL_IB_HCA": "mlx5", "LD_PRELOAD": "/evil.so", "nccl_lower": "1",
            "NCCL_SOCKET_IFNAME": "eth0\x1b[31m", **{f"NCCL_Y{i:03d}": "1" for i in range(200)}}
    who = parse_state(state(nccl_env=sent), Notes()).identity
    assert who.nccl_env is not None and len(who.nccl_env) <= MAX_NCCL_VARIABLES
    names = dict(who.nccl_env)
    assert "LD_PRELOAD" not in names and "nccl_lower" not in names
    assert all(name.startswith("NCCL_") for name in names)
    assert parse_state(state(), Notes()).identity.nccl_env is None
    assert parse_state(state(nccl_env={}), Notes()).identity.nccl_env == ()
    with pytest.raises(SchemaError, match="nccl_env"):
        parse_state(state(nccl_env=["NCCL_IB_HCA=x"]), Notes())
