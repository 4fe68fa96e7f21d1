"""The real `llmmon webhook` over real TLS: one AdmissionReview v1 per owner kind, the returned
JSONPatch applied and the pod validated as the API server would store it, idempotence, the
opt-in and opt-out, and hostile bodies that must never block a pod."""

from __future__ import annotations

import copy
import json
import os
import socket
import ssl
from pathlib import Path
from typing import Iterator

import kubernetes_validate
import pytest
import requests

from tests.helpers import wait_for
from tests.inject.webhook import IMAGE, OWNERS, Tls, Webhook, make_tls, review

K8S_VERSIONS = ("1.29.0", "1.37.0")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("webhook-tls"))


@pytest.fixture(scope="module")
def webhook(tls: Tls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    with Webhook(tls, tmp_path_factory.mktemp("webhook") / "webhook.log") as server:
        yield server


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("owner", OWNERS)
def test_each_owners_pod_is_patched_into_a_valid_pod_with_its_job_id(webhook, owner):
    pod, job = OWNERS[owner]
    answer, out = webhook.admit(pod)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(out, version, strict=True)
    (init,) = out["spec"]["initContainers"]
    assert (init["image"], init["args"]) == (IMAGE, [
        "copy-reporter", "/llmmon-reporter", f"--job-dir=/run/llmmon/frpipe/{job}",
        f"--job-dir=/var/lib/llmmon/fr/{job}"])  # torch makes neither; launch does
    assert {m["mountPath"] for m in init["volumeMounts"]} == {
        "/llmmon-reporter", "/run/llmmon/frpipe", "/var/lib/llmmon/fr"}
    (trainer,) = out["spec"]["containers"]
    env = env_of(trainer)
    assert env["LLMMON_JOB"]["value"] == job
    assert env["PYTHONPATH"]["value"] == "/llmmon-reporter/llmmon_reporter/boot"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]["value"] == f"/run/llmmon/frpipe/{job}/rank_"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert out["metadata"]["annotations"]["llmmon.io/injected"] == job
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    for path in ("/run/llmmon/ranks", "/run/llmmon/frpipe", "/var/lib/llmmon/fr"):
        assert volumes[mounts[path]]["hostPath"]["path"] == path
    assert "emptyDir" in volumes[mounts["/llmmon-reporter"]]
    # admitted again (reinvocation, a second webhook entry): nothing more to do
    again, twice = webhook.admit(out)
    assert "patch" not in again["response"] and twice == out


def test_the_same_job_name_in_two_namespaces_is_two_jobs(webhook):
    pod, _ = OWNERS["pytorchjob"]
    ids = {ns: env_of(webhook.admit(pod, namespace=ns)[1]["spec"]["containers"][0])
           ["LLMMON_JOB"]["value"] for ns in ("team-a", "team-b")}
    assert ids == {"team-a": "team-a.llama", "team-b": "team-b.llama"}


def test_a_pod_that_did_not_opt_in_or_opted_out_is_untouched(webhook):
    pod, _ = OWNERS["job"]
    silent = copy.deepcopy(pod)
    del silent["metadata"]["labels"]["llmmon.io/inject"]
    out_pod = copy.deepcopy(pod)
    out_pod["metadata"]["labels"]["llmmon.io/inject"] = "false"
    for candidate, path in ((silent, "/mutate"), (out_pod, "/mutate"),
                            (out_pod, "/mutate/namespace")):
        answer, out = webhook.admit(candidate, path)
        assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}
        assert out == candidate
    # the namespace's opt-in covers a pod without the label
    answer, out = webhook.admit(silent, "/mutate/namespace")
    assert env_of(out["spec"]["containers"][0])["LLMMON_JOB"]["value"] == "team-a.bert"


def test_what_the_user_set_is_kept_and_pythonpath_keeps_its_entries(webhook):
    pod, _ = OWNERS["pytorchjob"]
    pod = copy.deepcopy(pod)
    user_env = [
        {"name": "PYTHONPATH", "value": "/app:/libs"},
        {"name": "TORCH_NCCL_TRACE_BUFFER_SIZE", "value": "20000"},
        {"name": "LLMMON_JOB", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['training.kubeflow.org/job-name']"}}},
        {"name": "POD_NAME", "value": "mine"}]
    pod["spec"]["containers"][0]["env"] = copy.deepcopy(user_env)
    sidecar = {"name": "sidecar", "image": "busybox:1.37", "envFrom": [
        {"configMapRef": {"name": "paths"}}],
        "env": [{"name": "PYTHONPATH", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    plain = {"name": "plain", "image": "busybox:1.37", "envFrom": [
        {"configMapRef": {"name": "paths"}}]}
    pod["spec"]["containers"] += [sidecar, plain]
    _, out = webhook.admit(pod)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(out, version, strict=True)
    trainer, side, bare = (env_of(c) for c in out["spec"]["containers"])
    boot = "/llmmon-reporter/llmmon_reporter/boot"
    assert trainer["PYTHONPATH"]["value"] == f"{boot}:/app:/libs"
    assert trainer["POD_NAME"] == {"name": "POD_NAME", "value": "mine"}
    assert trainer["LLMMON_JOB"] == user_env[2]  # by reference: the kubelet fills it in
    assert trainer["TORCH_FR_BUFFER_SIZE"]["value"] == "20000"  # mirrored from the user's
    assert trainer["TORCH_FR_DUMP_TEMP_FILE"]["value"] == "/var/lib/llmmon/fr/$(LLMMON_JOB)/rank_"
    (init,) = out["spec"]["initContainers"]  # the kubelet expands its args from its own env
    assert user_env[2] in init["env"]
    assert "--job-dir=/var/lib/llmmon/fr/$(LLMMON_JOB)" in init["args"]
    # the user's own come first, in their order, so ours may refer to them
    assert [e["name"] for e in out["spec"]["containers"][0]["env"][:4]] == \
        [e["name"] for e in user_env]
    names = [e["name"] for e in out["spec"]["containers"][1]["env"]]
    assert names.index("LLMMON_USER_PYTHONPATH") == names.index("PYTHONPATH") - 1
    assert side["LLMMON_USER_PYTHONPATH"]["valueFrom"] == sidecar["env"][0]["valueFrom"]
    assert side["PYTHONPATH"]["value"] == f"{boot}:$(LLMMON_USER_PYTHONPATH)"
    assert bare["PYTHONPATH"]["value"] == f"{boot}:$(PYTHONPATH)"  # envFrom's, if it has one
    again, twice = webhook.admit(out)
    assert "patch" not in again["response"] and twice == out


def test_existing_volumes_and_mounts_of_the_shared_directories_are_reused(webhook):
    """A pod written after examples/training-job.yaml already mounts the three directories."""
    pod, _ = OWNERS["job"]
    pod = copy.deepcopy(pod)
    pod["spec"]["volumes"] = [{"name": "llmmon-ranks", "hostPath": {
        "path": "/run/llmmon/ranks", "type": "DirectoryOrCreate"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "llmmon-ranks", "mountPath": "/run/llmmon/ranks"}]
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox:1.37"}]
    _, out = webhook.admit(pod)
    kubernetes_validate.validate(out, K8S_VERSIONS[-1], strict=True)
    assert [v["name"] for v in out["spec"]["volumes"]].count("llmmon-ranks") == 1
    assert [m["mountPath"] for m in out["spec"]["containers"][0]["volumeMounts"]].count(
        "/run/llmmon/ranks") == 1
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["llmmon-reporter", "fetch"]


@pytest.mark.parametrize("body, says", [
    (b"not json at all", "not JSON"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
    (json.dumps({"kind": "Pod"}).encode(), "not an AdmissionReview"),
    (json.dumps({**review({}), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
     "admissionReviewVersions"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
     "no request with a uid"),
    (b"{" + b" " * (5 * 1024 * 1024) + b"}", "over the"),
], ids=["not-json", "deep-nesting", "wrong-kind", "v1beta1", "no-request", "huge"])
def test_hostile_bodies_get_a_clear_400(webhook, body, says):
    reply = webhook.post(body)
    assert reply.status_code == 400
    assert says in reply.json()["error"]
    assert webhook.process.poll() is None


def test_a_huge_body_without_a_length_is_cut_off_as_it_streams(webhook):
    def chunks():  # chunked transfer: no Content-Length to refuse it by; 16 MiB of spaces,
        for _ in range(64):  # which read whole would be "not JSON", not "over the limit"
            yield b" " * (256 * 1024)
    try:
        reply = requests.post(webhook.url + "/mutate", data=chunks(), timeout=30,
                              verify=str(webhook.tls.ca))
    except requests.exceptions.ConnectionError:
        reply = None  # the server answered and closed while we still sent: also a refusal
    if reply is not None:
        assert reply.status_code == 400 and "over the" in reply.json()["error"]
    assert webhook.process.poll() is None
    assert requests.get(webhook.url + "/healthz", verify=str(webhook.tls.ca), timeout=5).ok


@pytest.mark.parametrize("obj, kwargs, warns", [
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {}},
     {"kind": "Deployment", "group": "apps"}, True),
    (OWNERS["job"][0], {"operation": "UPDATE"}, False),
    ({"metadata": {"name": "p", "labels": {"llmmon.io/inject": "true"}},
      "spec": {"containers": [{"name": "c", "env": "PYTHONPATH=/x"}]}}, {}, True),
    ({"metadata": {"name": "p", "labels": {"llmmon.io/inject": "true"}},
      "spec": {"containers": "all of them"}}, {}, True),
    ({"metadata": "p", "spec": []}, {}, True),
    (None, {}, True),
], ids=["not-a-pod", "update", "env-not-a-list", "containers-not-a-list", "no-metadata",
        "no-object"])
def test_what_cannot_be_patched_is_allowed_unchanged(webhook, obj, kwargs, warns):
    sent = review(obj, **kwargs)
    reply = webhook.post(sent)
    assert reply.status_code == 200
    response = reply.json()["response"]
    assert response["uid"] == sent["request"]["uid"] and response["allowed"] is True
    assert "patch" not in response
    assert bool(response.get("warnings")) is warns
    assert all(w.startswith("llmmon: ") and len(w) <= 120 for w in response.get("warnings", []))


def test_health_and_tls(webhook, tls):
    assert requests.get(webhook.url + "/healthz", verify=str(tls.ca), timeout=5).text == "ok\n"
    with pytest.raises(requests.exceptions.SSLError):  # a client that trusts another CA
        requests.get(webhook.url + "/healthz", timeout=5)
    plain = socket.create_connection(("127.0.0.1", webhook.port), timeout=5)
    with plain:  # plain HTTP is not answered as HTTP
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not plain.recv(100).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=str(tls.ca))
    with socket.create_connection(("127.0.0.1", webhook.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="llmmon-webhook.llmmon.svc") as conn:
        assert conn.version() in ("TLSv1.2", "TLSv1.3")


def test_a_missing_certificate_fails_at_start(tmp_path: Path, tls: Tls):
    bad = Tls(tls.ca, tmp_path / "missing.crt", tls.key)
    server = Webhook(bad, tmp_path / "log")
    assert server.process.wait(timeout=60) == 1
    assert "missing.crt" in (tmp_path / "log").read_text()


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path):
    """cert-manager rewrites the Secret's files in place; the next handshakes use them."""
    first, second = make_tls(tmp_path / "first"), make_tls(tmp_path / "second")
    live = Tls(first.ca, tmp_path / "live.crt", tmp_path / "live.key")
    live.cert.write_bytes(first.cert.read_bytes())
    live.key.write_bytes(first.key.read_bytes())
    with Webhook(live, tmp_path / "log") as server:
        assert requests.get(server.url + "/healthz", verify=str(first.ca), timeout=5).ok
        live.key.write_bytes(second.key.read_bytes())
        live.cert.write_bytes(second.cert.read_bytes())
        os.utime(live.cert, (1, 1))  # a different mtime even within the clock's resolution

        def renewed() -> bool:
            try:
                return requests.get(server.url + "/healthz", verify=str(second.ca),
                                    timeout=5).ok
            except requests.exceptions.SSLError:
                return False
        wait_for(renewed, 20, "the renewed certificate to be served")
        assert server.process.poll() is None
