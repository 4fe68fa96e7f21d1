"""Who a rank is, from its environment: the pod label comes from the downward API's pod name
where the pod spec passes it (a hostNetwork pod's host name is its node's)."""

from __future__ import annotations

import socket

from llmmon_reporter.identity import identity


def test_the_pod_label_is_the_pod_name_the_downward_api_passes() -> None:
    who = identity({"POD_NAME": "llama-worker-3", "POD_NAMESPACE": "train", "LLMMON_JOB": "j"},
                   3, 8)
    assert (who["pod"], who["namespace"], who["job_id"]) == ("llama-worker-3", "train", "j")


def test_without_a_pod_name_the_host_name_stands_in() -> None:
    assert identity({"POD_NAME": "  ", "LLMMON_JOB": "j"}, 0, 1)["pod"] == socket.gethostname()
