"""deploy/kubernetes: every kustomization renders (real kubectl kustomize), core kinds pass
kubernetes-validate --strict, operator kinds pass their CRD schemas strictly, and every security
and scheduling choice of docs/security.md holds in every overlay."""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.deploy_helpers import KUSTOMIZE, ROOT, find, kustomize, require
from llmmon.cli import build_parser
from llmmon.collectors import discover
from llmmon.commands.deploy import rule_groups
from llmmon.config import Settings, build_settings

WEBHOOK = KUSTOMIZE / "webhook"
WEBHOOKS = [WEBHOOK / "base", WEBHOOK / "self-signed", WEBHOOK / "cert-manager"]
EXPORTER_KUSTOMIZATIONS = [KUSTOMIZE, KUSTOMIZE / "base", KUSTOMIZE / "monitoring",
                           *sorted(p for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir())]
KUSTOMIZATIONS = EXPORTER_KUSTOMIZATIONS + WEBHOOKS
WITH_EXPORTER = [k for k in EXPORTER_KUSTOMIZATIONS if k.name != "monitoring"]
# Kinds of operators whose CRDs the tests do not carry: checked by the webhook's own tests.
NOT_CORE = ("monitoring.coreos.com", "cert-manager.io")
EXAMPLES = sorted((KUSTOMIZE / "examples").glob("*.yaml"))
K8S_VERSIONS = ("1.29.0", "1.37.0")
CRDS = ROOT / "tests" / "fixtures" / "crds"
SPOOL = "/run/llmmon/ranks"
# Shared with training pods at the same paths: volume name -> (host path, read-only here).
SHARED = {"ranks": (SPOOL, True), "frpipe": ("/run/llmmon/frpipe", True),
          "fr": ("/var/lib/llmmon/fr", False)}
INCIDENTS = "/var/lib/llmmon/incidents"  # the exporter's own, not shared with training pods
NODE_TMPFILES = KUSTOMIZE / "node" / "llmmon.tmpfiles.conf"


def ident(path: Path) -> str:
    return str(path.relative_to(KUSTOMIZE)) if path != KUSTOMIZE else "default"


@cache
def rendered(path: Path) -> tuple[dict, ...]:
    return tuple(kustomize(path))


def objects(path: Path) -> list[dict]:
    return copy.deepcopy(list(rendered(path)))


def pod(path: Path) -> dict:
    return find(objects(path), "DaemonSet", "llmmon")["spec"]["template"]["spec"]


def container(path: Path) -> dict:
    return pod(path)["containers"][0]


def test_missing_kubectl_fails_with_the_projects_message(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AssertionError, match="kubectl is not installed: .* Kubernetes packages"):
        kustomize(KUSTOMIZE)


def test_every_kustomization_is_covered():
    found = {p.parent for p in KUSTOMIZE.rglob("kustomization.yaml")}
    assert found == set(KUSTOMIZATIONS)


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=ident)
def test_core_kinds_pass_kubernetes_validate_strict(path):
    core = [o for o in objects(path) if not o["apiVersion"].startswith(NOT_CORE)]
    assert core
    for obj in core:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_kubernetes_validate_strict(example):
    for obj in yaml.safe_load_all(example.read_text()):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def strict(schema: Any) -> Any:
    """kubeconform -strict: objects that list their properties admit no others. Also moves
    RE2's mid-pattern flags (`^(?i)...`, valid in Go) to the front, where Python wants them."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if isinstance(schema.get("pattern"), str) and schema["pattern"].startswith("^(?i)"):
            schema["pattern"] = "(?i)^" + schema["pattern"][len("^(?i)"):]
        if schema.get("properties") and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.mark.parametrize("path", EXPORTER_KUSTOMIZATIONS, ids=ident)
def test_operator_kinds_pass_their_crd_schemas(path):
    operator = [o for o in objects(path) if o["apiVersion"] == "monitoring.coreos.com/v1"]
    if path.name != "base":
        assert {o["kind"] for o in operator} == {"ServiceMonitor", "PrometheusRule"}
    for obj in operator:
        schema = strict(json.loads((CRDS / f"{obj['kind'].lower()}.json").read_text()))
        jsonschema.validate(obj, schema)


def test_crd_check_catches_a_misspelt_field():
    monitor = find(objects(KUSTOMIZE), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["honorlabels"] = False
    schema = strict(json.loads((CRDS / "servicemonitor.json").read_text()))
    with pytest.raises(jsonschema.ValidationError, match="honorlabels"):
        jsonschema.validate(monitor, schema)


# --- security (docs/security.md, research §d) ------------------------------------------------

@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_container_hardening(path):
    sc = container(path)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    if path.name == "zero-touch":  # py-spy reads the ranks' memory (docs/deployment.md)
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    else:
        assert sc["capabilities"] == {"drop": ["ALL"]}  # nothing added in any other overlay
    spec = pod(path)
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["hostIPC"] is False
    assert spec["automountServiceAccountToken"] is False
    account = find(objects(path), "ServiceAccount", spec["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    assert not [o for o in objects(path) if o["kind"] in ("Role", "ClusterRole",
                                                          "RoleBinding", "ClusterRoleBinding")]


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_user_and_host_pid(path):
    spec = pod(path)
    sc = spec["securityContext"]
    if path.name in ("pod-attribution", "zero-touch"):  # root-owned host files, processes
        assert spec["hostPID"] is True and sc["runAsUser"] == 0
        assert sc["runAsNonRoot"] is False
    else:
        assert spec["hostPID"] is False
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == sc["runAsGroup"] == 65534


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_host_mounts_are_minimal_and_read_only_but_the_dump_directory(path, tmp_path):
    spec = pod(path)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    relay = {"kmsg": "/dev/kmsg"} if path.name == "kernel-log" else {}  # the sidecar's only
    assert host == {"sys": "/sys", "proc": "/proc", **relay, "incidents": INCIDENTS,
                    **{name: where for name, (where, _) in SHARED.items()}}
    assert not relay.keys() & {m["name"] for m in container(path)["volumeMounts"]}
    mounts = {m["name"]: m for m in container(path)["volumeMounts"]}
    writable = {name for name, m in mounts.items() if m.get("readOnly") is not True}
    # settled dumps are moved into sets and old sets pruned; incidents are written
    assert writable == {"fr", "incidents"}
    assert container(path)["securityContext"]["readOnlyRootFilesystem"] is True
    for name, (where, read_only) in SHARED.items():
        assert mounts[name]["mountPath"] == where  # the paths training pods use
        assert mounts[name].get("readOnly", False) is read_only
    args = container(path)["args"]
    config = yaml.safe_load(
        find(objects(path), "ConfigMap", _config_name(path))["data"]["config.yaml"])
    assert config["path"] == {"sysfs": mounts["sys"]["mountPath"],
                              "procfs": mounts["proc"]["mountPath"]}
    assert args[0] == "serve" and "--config.file=/etc/llmmon/config.yaml" in args
    ranks = _settings(path, tmp_path).collectors["ranks"]  # what the ranks collector opens
    assert (ranks["spool_dir"], ranks["pipe_dir"], ranks["fr_dir"]) == \
        tuple(mounts[name]["mountPath"] for name in ("ranks", "frpipe", "fr"))
    assert _settings(path, tmp_path).collectors["incidents"]["dir"] == \
        mounts["incidents"]["mountPath"]


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_only_the_kernel_log_overlay_adds_a_container_and_it_is_the_relay_alone(path, tmp_path):
    spec = pod(path)
    assert [c["name"] for c in spec["containers"]] == ["llmmon"]
    if path.name != "kernel-log":
        assert "initContainers" not in spec
        return
    [relay] = spec["initContainers"]
    kmsg_path = _settings(path, tmp_path).collectors["gpu"]["kmsg_path"]
    assert relay["restartPolicy"] == "Always"  # a native sidecar, started before the exporter
    assert relay["image"] == container(path)["image"]
    assert relay["args"][0] == "kmsg-relay" and f"--out={kmsg_path}" in relay["args"]
    probe = relay["startupProbe"]["exec"]["command"]
    assert probe[1:] == ["kmsg-relay", "--check", f"--out={kmsg_path}"]
    assert "ports" not in relay
    assert relay["securityContext"]["privileged"] is True  # /dev/kmsg: the reason it exists
    assert relay["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in relay["volumeMounts"]}
    assert set(mounts) == {"kmsg", "kernel-log"}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["kernel-log"]["emptyDir"]["medium"] == "Memory"
    shared = next(m for m in container(path)["volumeMounts"] if m["name"] == "kernel-log")
    assert shared["readOnly"] is True
    assert kmsg_path.rsplit("/", 1)[0] == shared["mountPath"] == mounts["kernel-log"]["mountPath"]


def test_node_tmpfiles_make_every_shared_directory_for_the_daemonsets_user():
    lines = [line.split() for line in NODE_TMPFILES.read_text().splitlines()
             if line and not line.startswith("#")]
    made = {line[1]: line[2] for line in lines if line[0] == "d"}
    for where, _ in SHARED.values():
        assert made[where] == "1777", where  # any training user makes its job's directory
    uid = pod(KUSTOMIZE)["securityContext"]["runAsUser"]
    acls = {line[1]: line[6] for line in lines if line[0] == "a+"}
    assert set(acls) == {SHARED["frpipe"][0], SHARED["fr"][0]}
    assert all(f"default:user:{uid}:rwx" in acl.split(",") for acl in acls.values())
    gid = pod(KUSTOMIZE)["securityContext"]["runAsGroup"]
    incidents = next(line for line in lines if line[0] == "d" and line[1] == INCIDENTS)
    assert incidents[2:5] == ["0750", str(uid), str(gid)]  # the exporter's alone


def _config_name(path: Path) -> str:
    return next(v["configMap"]["name"] for v in pod(path)["volumes"] if v["name"] == "config")


def _settings(path: Path, tmp_path: Path) -> Settings:
    """The ConfigMap's config.yaml through the real settings parser."""
    data = find(objects(path), "ConfigMap", _config_name(path))["data"]["config.yaml"]
    file = tmp_path / "config.yaml"
    file.write_text(data)
    args = build_parser().parse_args(["serve", f"--config.file={file}"])
    return build_settings(args, discover())


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_config_is_accepted_by_the_exporter(path, tmp_path):
    """No unknown key slips in; each overlay's additions arrive."""
    settings = _settings(path, tmp_path)
    assert settings.collectors["nfs"]["enabled"] is (path.name == "pod-attribution")
    web = settings["web.config_file"]
    if path.name == "tls":
        mount = next(m for m in container(path)["volumeMounts"] if m["name"] == "web")
        assert web == mount["mountPath"] + "/web-config.yml"
    else:
        assert web == ""


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_scheduling_probes_resources_and_upgrades(path):
    objs = objects(path)
    ds = find(objs, "DaemonSet", "llmmon")
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"]["kubernetes.io/os"] == "linux"
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert any(_tolerates(t, gpu_taint) for t in spec["tolerations"])
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = container(path)
    scheme = "HTTPS" if path.name == "tls" else "HTTP"
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
        assert c[probe]["httpGet"]["port"] == "metrics"
        assert c[probe]["httpGet"].get("scheme", "HTTP") == scheme
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    selector = ds["spec"]["selector"]["matchLabels"]
    assert not [k for k in selector if "version" in k or k == "helm.sh/chart"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    image = c["image"]
    assert ":" in image and not image.endswith(":latest")
    assert {"name": "metrics", "containerPort": 9476, "protocol": "TCP"} in c["ports"]


def _tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") not in (None, taint["effect"]):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, taint["key"])
    return toleration.get("key") == taint["key"] and toleration.get("value") == taint["value"]


@pytest.mark.parametrize("path", WITH_EXPORTER, ids=ident)
def test_namespace_service_and_network_policy(path):
    objs = objects(path)
    ns = find(objs, "Namespace", "llmmon")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} \
        == {"llmmon"}
    pod_labels = find(objs, "DaemonSet", "llmmon")["spec"]["template"]["metadata"]["labels"]
    service = find(objs, "Service", "llmmon")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    policy = find(objs, "NetworkPolicy", "llmmon")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9476}]
    (source,) = rule["from"]
    assert source["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


@pytest.mark.parametrize("path", [k for k in EXPORTER_KUSTOMIZATIONS if k.name != "base"],
                         ids=ident)
def test_service_monitor_scrapes_the_service_as_job_llmmon(path):
    objs = objects(path)
    monitor = find(objs, "ServiceMonitor", "llmmon")["spec"]
    service = find(objects(KUSTOMIZE / "base"), "Service", "llmmon")
    assert service["metadata"]["name"] == "llmmon"  # job label = Service name, as rules expect
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["honorLabels"] is False
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in endpoint["relabelings"]
    if path.name == "tls":
        assert endpoint["scheme"] == "https" and endpoint["basicAuth"]
        assert endpoint["tlsConfig"]["serverName"] == "llmmon"


def test_tls_overlay_mounts_web_config_beside_its_certificates():
    spec = pod(KUSTOMIZE / "overlays" / "tls")
    web = next(v for v in spec["volumes"] if v["name"] == "web")["projected"]["sources"]
    secret = find(objects(KUSTOMIZE / "overlays" / "tls"), "Secret", web[0]["secret"]["name"])
    config = yaml.safe_load(base64.b64decode(secret["data"]["web-config.yml"]))
    paths = {item["path"] for source in web[1:] for item in source["secret"]["items"]}
    tls = config["tls_server_config"]
    assert {tls["cert_file"], tls["key_file"]} <= paths


# --- generated objects: exactly what alerts/ and dashboards/ ship ----------------------------

def test_generated_files_are_current():
    out = subprocess.run([sys.executable, "-m", "llmmon", "deploy", "generate", "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_prometheus_rule_carries_exactly_the_shipped_rules(tmp_path):
    rule = find(objects(KUSTOMIZE), "PrometheusRule", "llmmon")
    shipped = []
    for path in sorted((ROOT / "alerts" / "rules").glob("*.yaml")):
        shipped.extend(yaml.safe_load(path.read_text())["groups"])
    assert rule["spec"]["groups"] == shipped == rule_groups(ROOT)
    names = [r.get("alert") or r.get("record") for g in shipped for r in g["rules"]]
    assert len(names) == sum(len(g["rules"]) for g in rule["spec"]["groups"])
    extracted = tmp_path / "rules.yaml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([require("promtool"), "check", "rules", str(extracted)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_config_maps_carry_every_dashboard_verbatim():
    maps = [o for o in objects(KUSTOMIZE) if o["kind"] == "ConfigMap"
            and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert shipped
    found = {}
    for cm in maps:
        (name, text), = cm["data"].items()
        found[name] = text
        # client-side `kubectl apply` keeps the whole object in a 256 KiB annotation
        assert len(json.dumps(cm, separators=(",", ":"))) < 262144, name
    assert found == shipped


def test_alertmanager_example_secret_is_the_shipped_config(tmp_path):
    source = ROOT / "alerts" / "alertmanager.yaml"
    example = KUSTOMIZE / "examples" / "alertmanager-secret.yaml"
    assert source.exists() == example.exists()
    if not source.exists():
        return
    (secret,) = yaml.safe_load_all(example.read_text())
    data = secret["stringData"]
    assert data["alertmanager.yaml"] == source.read_text()
    for name, text in data.items():  # the config and every template it names, verbatim
        assert (source.parent / name).read_text() == text
        (tmp_path / name).write_text(text)
    out = subprocess.run([require("amtool"), "check-config", str(tmp_path / "alertmanager.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_training_job_writes_where_the_exporter_reads():
    (job,) = yaml.safe_load_all((KUSTOMIZE / "examples" / "training-job.yaml").read_text())
    spec = job["spec"]["template"]["spec"]
    (trainer,) = spec["containers"]
    assert trainer["command"][:3] == ["llmmon", "launch", "--"]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["LLMMON_SPOOL"]["value"] == SPOOL
    assert env["LLMMON_JOB"]["valueFrom"]["fieldRef"]["fieldPath"].startswith("metadata.labels")
    volumes = {v["name"]: v for v in spec["volumes"]}
    exporter = {v["name"]: v for v in pod(KUSTOMIZE)["volumes"]}
    for name, (where, _) in SHARED.items():
        mount = next(m for m in trainer["volumeMounts"] if m["mountPath"] == where)
        assert mount.get("readOnly", False) is False  # the trainer writes all three
        assert volumes[mount["name"]]["hostPath"] == exporter[name]["hostPath"]
    # Where the Job's `llmmon launch` (its own flags, its env) points torch's Flight Recorder.
    launch = trainer["command"][1:trainer["command"].index("--")]
    out = subprocess.run([sys.executable, "-m", "llmmon", *launch, "--print-env"],
                         env={"PATH": "/usr/bin:/bin", "LLMMON_JOB": "llm-pretrain",
                              "LLMMON_SPOOL": env["LLMMON_SPOOL"]["value"]},
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    torch = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert torch["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{SHARED['frpipe'][0]}/llm-pretrain/rank_"
    assert torch["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{SHARED['fr'][0]}/llm-pretrain/rank_"


# --- the injection webhook (deploy/kubernetes/webhook, docs/deployment.md) ------------------

def webhook_args(objs: list[dict]) -> tuple[dict, Any]:
    """The webhook's container and its args through the real `llmmon webhook` parser (with
    the kubelet's `$(VAR)` expansion from its env)."""
    (c,) = find(objs, "Deployment", "llmmon-webhook")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    args = [a.replace("$(LLMMON_INIT_IMAGE)", env["LLMMON_INIT_IMAGE"]) for a in c["args"]]
    return c, build_parser().parse_args(args)


@pytest.mark.parametrize("path", WEBHOOKS, ids=ident)
def test_webhook_deployment_is_redundant_hardened_and_probed(path):
    objs = objects(path)
    deployment = find(objs, "Deployment", "llmmon-webhook")
    spec = deployment["spec"]["template"]["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (term,) = spec["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    pdb = find(objs, "PodDisruptionBudget", "llmmon-webhook")["spec"]
    assert pdb["minAvailable"] == 1 and pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    # never selected by the exporter's Service or NetworkPolicy, nor the other way round
    exporter = find(objects(KUSTOMIZE / "base"), "DaemonSet", "llmmon")
    exporter_labels = exporter["spec"]["template"]["metadata"]["labels"]
    assert not find(objects(KUSTOMIZE / "base"), "Service", "llmmon")["spec"][
        "selector"].items() <= pod_labels.items()
    assert not pdb["selector"]["matchLabels"].items() <= exporter_labels.items()
    c, args = webhook_args(objs)
    assert args.command == "webhook" and args.listen == ("0.0.0.0", 8443)
    assert args.image == c["image"] and ":" in c["image"]  # the init container's: its own
    sc, pod_sc = c["securityContext"], spec["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 65534
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert find(objs, "ServiceAccount", spec["serviceAccountName"])[
        "automountServiceAccountToken"] is False
    assert not [o for o in objs if o["kind"].endswith(("Role", "RoleBinding"))]
    (port,) = c["ports"]
    assert port["containerPort"] == args.listen[1]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": port["name"],
                                       "scheme": "HTTPS"}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert mount["readOnly"] is True and "subPath" not in mount  # renewals reach the files
    secret = next(v for v in spec["volumes"] if v["name"] == "tls")["secret"]["secretName"]
    assert (args.tls_cert_file, args.tls_key_file) == \
        (f"{mount['mountPath']}/tls.crt", f"{mount['mountPath']}/tls.key")
    assert secret == "llmmon-webhook-tls"
    assert {o["metadata"].get("namespace") for o in objs
            if o["kind"] != "MutatingWebhookConfiguration"} == {"llmmon"}


@pytest.mark.parametrize("path", WEBHOOKS, ids=ident)
def test_webhook_configuration_never_blocks_pods_and_selects_only_opted_in_ones(path):
    from llmmon.inject.server import create_app
    from llmmon.inject.podpatch import Settings

    objs = objects(path)
    service = find(objs, "Service", "llmmon-webhook")
    routes = {r.path for r in create_app(Settings(image="x")).routes}
    config = find(objs, "MutatingWebhookConfiguration", "llmmon-webhook")
    paths = []
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] <= 5 and hook["admissionReviewVersions"] == ["v1"]
        assert hook["reinvocationPolicy"] == "IfNeeded"  # the patch adds only what is missing
        assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""],
                                  "apiVersions": ["v1"], "resources": ["pods"],
                                  "scope": "Namespaced"}]
        target = hook["clientConfig"]["service"]
        assert (target["name"], target["namespace"]) == (service["metadata"]["name"],
                                                        service["metadata"]["namespace"])
        assert target["port"] == service["spec"]["ports"][0]["port"]
        assert target["path"] in routes
        paths.append(target["path"])
        excluded = next(e for e in hook["namespaceSelector"]["matchExpressions"]
                        if e["key"] == "kubernetes.io/metadata.name")
        assert excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {"llmmon", "kube-system"}
    by_pod, by_namespace = config["webhooks"]
    assert by_pod["objectSelector"] == {"matchLabels": {"llmmon.io/inject": "true"}}
    assert by_namespace["objectSelector"]["matchExpressions"] == [
        {"key": "llmmon.io/inject", "operator": "NotIn", "values": ["false"]}]
    assert {"key": "llmmon.io/inject", "operator": "In", "values": ["true"]} in \
        by_namespace["namespaceSelector"]["matchExpressions"]
    assert paths == ["/mutate", "/mutate/namespace"]
    annotations = config["metadata"].get("annotations", {})
    if path.name == "cert-manager":
        certificate = find(objs, "Certificate", "llmmon-webhook")
        ns = certificate["metadata"]["namespace"]
        assert annotations == {"cert-manager.io/inject-ca-from":
                               f"{ns}/{certificate['metadata']['name']}"}
        spec = certificate["spec"]
        assert spec["secretName"] == "llmmon-webhook-tls"
        assert f"{target['name']}.{target['namespace']}.svc" in spec["dnsNames"]
        issuer = find(objs, spec["issuerRef"]["kind"], spec["issuerRef"]["name"])
        assert issuer["metadata"]["namespace"] == ns and "selfSigned" in issuer["spec"]
    else:
        assert "cert-manager.io/inject-ca-from" not in annotations


def test_the_webhook_image_follows_kustomize_edit_set_image(tmp_path):
    """The injected init container runs the webhook's own image, whatever it is set to."""
    copy_of = tmp_path / "webhook"
    shutil.copytree(WEBHOOK, copy_of)
    config = copy_of / "base" / "kustomization.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["images"] = [{"name": "llmmon", "newName": "registry.example.com/llmmon",
                      "digest": "sha256:" + "ab" * 32}]
    config.write_text(yaml.safe_dump(doc))
    c, args = webhook_args(kustomize(copy_of / "self-signed"))
    assert args.image == c["image"] == "registry.example.com/llmmon@sha256:" + "ab" * 32


def test_self_signed_script_makes_a_valid_secret_and_ca_bundle_for_both_entries(tmp_path):
    script = WEBHOOK / "self-signed" / "self-signed.sh"
    done = subprocess.run(["bash", str(script), "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (secret,) = yaml.safe_load_all((tmp_path / "secret.yaml").read_text())
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    deployment_secret = next(v for v in find(objects(WEBHOOK / "self-signed"), "Deployment")[
        "spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")["secret"]["secretName"]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"], secret["type"]) == \
        (deployment_secret, "llmmon", "kubernetes.io/tls")
    cert = tmp_path / "tls.crt"
    cert.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    ca = tmp_path / "ca.crt"
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-purpose", "sslserver",
                               "-verify_hostname", "llmmon-webhook.llmmon.svc", str(cert)],
                              capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    config = find(objects(WEBHOOK / "self-signed"), "MutatingWebhookConfiguration")
    patch = json.loads((tmp_path / "cabundle-patch.json").read_text())
    assert [op["path"] for op in patch] == [f"/webhooks/{i}/clientConfig/caBundle"
                                           for i in range(len(config["webhooks"]))]
    assert {base64.b64decode(op["value"]) for op in patch} == {ca.read_bytes()}
