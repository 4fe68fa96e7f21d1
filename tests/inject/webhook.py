"""Helpers for the webhook's tests, both tiers: pods as each owner's controller makes them,
AdmissionReviews, certificates, and a real `llmmon webhook` process over TLS."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import requests

from tests.conftest import ROOT
from tests.deploy.deploy_helpers import ca, issue, wait_for_port
from tests.helpers import free_port, stop_process

IMAGE = "ghcr.io/llmmon/llmmon:0.1.0"


def _pod(name: str, labels: dict[str, str], owner: tuple[str, str, str] | None = None,
         **spec: Any) -> dict[str, Any]:
    """A pod as its controller submits it: labels from the template, the controller's ref."""
    meta: dict[str, Any] = {"name": name, "labels": {"llmmon.io/inject": "true", **labels}}
    if owner:
        api, kind, owner_name = owner
        meta["ownerReferences"] = [{"apiVersion": api, "kind": kind, "name": owner_name,
                                    "uid": str(uuid.uuid4()), "controller": True,
                                    "blockOwnerDeletion": True}]
    trainer = {"name": "trainer", "image": "registry.example.com/llm-trainer:2026.11",
               "command": ["torchrun", "--nproc-per-node=8", "train.py"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"restartPolicy": "Never", "containers": [trainer], **spec}}


# name -> (pod, the job id its ranks must report under in namespace "team-a"). The labels are
# the ones each controller sets (docs/deployment.md cites where each is defined).
OWNERS: dict[str, tuple[dict[str, Any], str]] = {
    "pytorchjob": (_pod("llama-worker-0", {
        "training.kubeflow.org/job-name": "llama",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0"},
        ("kubeflow.org/v1", "PyTorchJob", "llama")), "team-a.llama"),
    "trainjob": (_pod("ft-run-node-0-0-x2k9d", {
        "trainer.kubeflow.org/trainjob-name": "ft-run",
        "jobset.sigs.k8s.io/jobset-name": "ft-run",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-name": "ft-run-node-0", "job-name": "ft-run-node-0",
        "batch.kubernetes.io/job-completion-index": "0"},
        ("batch/v1", "Job", "ft-run-node-0")), "team-a.ft-run"),
    "jobset": (_pod("pretrain-workers-1-0-abcde", {
        "jobset.sigs.k8s.io/jobset-name": "pretrain",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": "1",
        "batch.kubernetes.io/job-name": "pretrain-workers-1", "job-name": "pretrain-workers-1"},
        ("batch/v1", "Job", "pretrain-workers-1")), "team-a.pretrain"),
    "leaderworkerset-worker": (_pod("serve-1-2", {
        "leaderworkerset.sigs.k8s.io/name": "serve",
        "leaderworkerset.sigs.k8s.io/group-index": "1",
        "leaderworkerset.sigs.k8s.io/worker-index": "2"},
        ("apps/v1", "StatefulSet", "serve-1")), "team-a.serve.1"),
    "leaderworkerset-leader": (_pod("serve-1", {
        "leaderworkerset.sigs.k8s.io/name": "serve",
        "leaderworkerset.sigs.k8s.io/worker-index": "0"},
        ("apps/v1", "StatefulSet", "serve")), "team-a.serve.1"),
    "job": (_pod("bert-7xk2p", {"batch.kubernetes.io/job-name": "bert", "job-name": "bert",
                                "batch.kubernetes.io/controller-uid": "u1"},
                 ("batch/v1", "Job", "bert")), "team-a.bert"),
    "job-legacy-label": (_pod("old-q8m", {"job-name": "old"}, ("batch/v1", "Job", "old")),
                         "team-a.old"),
    "volcano": (_pod("vj-worker-0", {"volcano.sh/job-name": "vj",
                                     "volcano.sh/job-namespace": "team-a",
                                     "volcano.sh/task-spec": "worker"},
                     ("batch.volcano.sh/v1alpha1", "Job", "vj")), "team-a.vj"),
    "bare-pod": (_pod("solo", {}), "team-a.solo"),
}


def review(obj: Any, namespace: str = "team-a", operation: str = "CREATE",
           kind: str = "Pod", group: str = "") -> dict[str, Any]:
    """An AdmissionReview v1 request as the API server sends it."""
    resource = {"group": group, "version": "v1", "resource": kind.lower() + "s"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": {**resource, "kind": kind},
                        "resource": resource, "requestKind": {**resource, "kind": kind},
                        "namespace": namespace, "operation": operation,
                        "userInfo": {"username": "system:serviceaccount:kubeflow:operator"},
                        "object": obj, "oldObject": None, "dryRun": False}}


def patched(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The pod with the answer's JSONPatch applied (the pod itself when there is none)."""
    response = answer["response"]
    if "patch" not in response:
        return copy.deepcopy(pod)
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, ops)


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path


def make_tls(where: Path) -> Tls:
    """A CA and a serving certificate for 127.0.0.1 and the webhook's Service name."""
    where.mkdir(parents=True, exist_ok=True)
    ca(where, "ca")
    issue(where, "webhook", "ca", "/CN=llmmon-webhook.llmmon.svc",
          "subjectAltName=IP:127.0.0.1,DNS:llmmon-webhook.llmmon.svc\n"
          "extendedKeyUsage=serverAuth\n")
    return Tls(where / "ca.crt", where / "webhook.crt", where / "webhook.key")


class Webhook:
    """A real `llmmon webhook` on 127.0.0.1; use as a context manager."""

    def __init__(self, tls: Tls, log: Path, *flags: str) -> None:
        self.tls, self.log, self.port = tls, log, free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        with open(log, "wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llmmon", "webhook", f"--tls-cert-file={tls.cert}",
                 f"--tls-key-file={tls.key}", f"--listen=127.0.0.1:{self.port}",
                 f"--image={IMAGE}", *flags],
                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)

    def __enter__(self) -> Webhook:
        try:
            wait_for_port(self.port, self.process, self.log)
        except BaseException:
            stop_process(self.process)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop_process(self.process)

    def post(self, body: Any, path: str = "/mutate", **kwargs: Any) -> requests.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return requests.post(self.url + path, data=data, verify=str(self.tls.ca), timeout=10,
                             headers={"Content-Type": "application/json"}, **kwargs)

    def admit(self, pod: dict[str, Any], path: str = "/mutate", **review_args: Any
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the answer, the pod as the API server would store it)."""
        sent = review(pod, **review_args)
        reply = self.post(sent, path)
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == sent["request"]["uid"]
        assert answer["response"]["allowed"] is True
        return answer, patched(pod, answer)


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def kubelet_environment(container: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """The container's env as the kubelet resolves it: in order, `$(NAME)` expanded from what
    was defined before it (left as is when nothing was, `$$` an escaped `$`), downward API
    fields from `fields`. ConfigMaps and Secrets are not needed by these tests."""
    env: dict[str, str] = {}

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    for item in container.get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = _REFERENCE.sub(expand, item.get("value", ""))
    return env
