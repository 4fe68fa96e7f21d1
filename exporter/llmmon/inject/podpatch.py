"""The JSONPatch that gives an opted-in pod what `llmmon launch` gives a command.

An init container copies the reporter into an emptyDir; every container gets its start-up hook
first on PYTHONPATH, the job's identity, the Flight Recorder settings of `llmmon launch` (the
same function computes them: `trainerenv.environment`) and the node's three shared directories.
Every step adds only what is missing, so patching a patched pod yields no operation: the API
server may call the webhook again (reinvocation) and a container another webhook added since
still gets what it lacks. Nothing that is already there is changed, but PYTHONPATH, which gains
the hook in front.
"""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass
from typing import Any, Mapping

from llmmon.inject import trainerenv
from llmmon.inject.owner import Owner, job_owner
from llmmon_reporter import layout

OPT_IN_LABEL = "llmmon.io/inject"
INJECTED_ANNOTATION = "llmmon.io/injected"  # its value: the job id derived from the owner
INIT_CONTAINER = "llmmon-reporter"
REPORTER_VOLUME = "llmmon-reporter"
# A PYTHONPATH that comes from valueFrom is read into this first, then referenced.
USER_PYTHONPATH = "LLMMON_USER_PYTHONPATH"
DOWNWARD = (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
            ("NODE_NAME", "spec.nodeName"))
_JOB_MARK = "llmmon-job-mark"  # stands for $(LLMMON_JOB) while paths are built from it
JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class Settings:
    """What the webhook injects: its flags."""

    image: str
    reporter_dir: str = "/llmmon-reporter"  # the emptyDir, at this path in every container
    spool: str = layout.DEFAULT_SPOOL
    pipe_dir: str = layout.DEFAULT_PIPE_DIR
    fr_dir: str = layout.DEFAULT_FR_DIR
    fr_buffer: int = 2000
    nccl_log: bool = True  # NCCL's INFO log to a file, where the container sets no NCCL_DEBUG

    @property
    def boot_dir(self) -> str:
        return posixpath.join(self.reporter_dir, "llmmon_reporter", "boot")

    @property
    def host_dirs(self) -> dict[str, str]:
        """Volume name -> host path, the same path inside the pod (as the DaemonSet has it)."""
        return {"llmmon-ranks": self.spool, "llmmon-frpipe": self.pipe_dir,
                "llmmon-fr": self.fr_dir}


def opted_in(labels: Mapping[str, Any], namespace_opted_in: bool) -> bool:
    """The pod's label decides; without one, its namespace's (an opt-out always wins)."""
    value = str(labels.get(OPT_IN_LABEL, "")).strip().lower()
    return value == "true" or (namespace_opted_in and value != "false")


def pod_patch(pod: Mapping[str, Any], namespace: str, settings: Settings) -> JsonPatch:
    """The operations that add what the pod lacks; [] when it lacks nothing."""
    meta = pod.get("metadata") or {}
    spec = pod["spec"]
    owner = job_owner(namespace, meta)
    ops: JsonPatch = []
    _add_items(ops, spec, "/spec/volumes", [
        v for v in _volumes(settings)
        if v["name"] not in {x.get("name") for x in spec.get("volumes") or []}])
    envs = [container_env(c, owner, settings) for c in spec.get("containers") or []]
    inits = spec.get("initContainers") or []
    if INIT_CONTAINER not in {c.get("name") for c in inits}:
        ops.append({"op": "add", "path": "/spec/initContainers",
                    "value": [init_container(settings, envs), *inits]})
    for i, (container, env) in enumerate(zip(spec.get("containers") or [], envs)):
        if env != (container.get("env") or []):
            ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": env})
        mounts = container.get("volumeMounts") or []
        taken = {m.get("mountPath") for m in mounts}
        missing = [m for m in _mounts(settings) if m["mountPath"] not in taken]
        if missing:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/volumeMounts",
                        "value": [*mounts, *missing]})
    annotations = meta.get("annotations") or {}
    if INJECTED_ANNOTATION not in annotations:
        if isinstance(meta.get("annotations"), dict):
            ops.append({"op": "add", "path": "/metadata/annotations/"
                        + INJECTED_ANNOTATION.replace("~", "~0").replace("/", "~1"),
                        "value": owner.job_id})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {INJECTED_ANNOTATION: owner.job_id}})
    return ops


def container_env(container: Mapping[str, Any], owner: Owner,
                  settings: Settings) -> list[dict[str, Any]]:
    """The container's env list with ours added after the user's own (so `$(NAME)` in ours can
    refer to theirs). A variable set by valueFrom is seen as `$(NAME)`: the kubelet expands it."""
    env = copy.deepcopy(list(container.get("env") or []))
    seen = {e["name"]: f"$({e['name']})" if "valueFrom" in e else str(e.get("value", ""))
            for e in env if isinstance(e.get("name"), str)}
    job = seen.get("LLMMON_JOB", owner.job_id)
    by_reference = job == "$(LLMMON_JOB)"
    wanted = trainerenv.environment(
        seen, _JOB_MARK if by_reference else job, seen.get("LLMMON_SPOOL", settings.spool),
        settings.fr_dir, settings.pipe_dir, settings.fr_buffer, timing=False,
        dump_on_timeout=True, boot_dir=settings.boot_dir,
        # envFrom may set NCCL_DEBUG where the webhook cannot see it: leave NCCL's log alone
        nccl_log=settings.nccl_log and not container.get("envFrom"))
    if by_reference:
        wanted = {k: v.replace(_JOB_MARK, "$(LLMMON_JOB)") for k, v in wanted.items()}
    _prepend_boot(env, settings.boot_dir, bool(container.get("envFrom")))
    names = {e.get("name") for e in env}
    env += [{"name": k, "value": v} for k, v in wanted.items() if k not in names]
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for k, path in DOWNWARD if k not in names]
    return env


def _prepend_boot(env: list[dict[str, Any]], boot_dir: str, env_from: bool) -> None:
    """PYTHONPATH with the hook first. One set by value keeps its entries; one from valueFrom
    is read into LLMMON_USER_PYTHONPATH and referenced; without one, `$(PYTHONPATH)` picks up
    a value from envFrom (the kubelet reads envFrom first; unset, it stays a path that does
    not exist). A PYTHONPATH from the image's own ENV is replaced: docs/deployment.md."""
    index = next((i for i in reversed(range(len(env))) if env[i].get("name") == "PYTHONPATH"),
                 None)
    if index is None:
        value = trainerenv.first_on_path(boot_dir, "$(PYTHONPATH)" if env_from else "")
        env.append({"name": "PYTHONPATH", "value": value})
    elif "valueFrom" in env[index]:
        env[index:index + 1] = [
            {"name": USER_PYTHONPATH, "valueFrom": env[index]["valueFrom"]},
            {"name": "PYTHONPATH", "value": f"{boot_dir}:$({USER_PYTHONPATH})"}]
    else:
        env[index]["value"] = trainerenv.first_on_path(boot_dir, str(env[index].get("value", "")))


def init_container(settings: Settings, envs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Copies the reporter into the emptyDir and makes the job's dump and pipe directories (as
    `llmmon launch` does: torch creates neither), as the image's unprivileged user."""
    values = [{e["name"]: e.get("value", "") for e in env} for env in envs]
    dirs = sorted({d for v in values for d in trainerenv.job_dirs(v)
                   if d.startswith((settings.fr_dir + "/", settings.pipe_dir + "/"))})
    # A job id from valueFrom: the kubelet expands $(LLMMON_JOB) in args from this env.
    by_reference = next(([e] for env in envs for e in env if e["name"] == "LLMMON_JOB"
                         and "valueFrom" in e), [])
    return {
        "name": INIT_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        # the image's entrypoint is llmmon
        "args": ["copy-reporter", settings.reporter_dir, *(f"--job-dir={d}" for d in dirs)],
        # The image asks the NVIDIA runtime for every GPU (the DaemonSet's NVML needs them);
        # a copy needs none.
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, *by_reference],
        "volumeMounts": [{"name": REPORTER_VOLUME, "mountPath": settings.reporter_dir},
                         *({"name": name, "mountPath": path}
                           for name, path in settings.host_dirs.items()
                           if path in (settings.fr_dir, settings.pipe_dir))],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _volumes(settings: Settings) -> list[dict[str, Any]]:
    return [{"name": REPORTER_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}},
            *({"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
              for name, path in settings.host_dirs.items())]


def _mounts(settings: Settings) -> list[dict[str, Any]]:
    return [{"name": REPORTER_VOLUME, "mountPath": settings.reporter_dir, "readOnly": True},
            *({"name": name, "mountPath": path} for name, path in settings.host_dirs.items())]


def _add_items(ops: JsonPatch, spec: Mapping[str, Any], path: str, items: list) -> None:
    if not items:
        return
    if isinstance(spec.get(path.rsplit("/", 1)[1]), list):
        ops.extend({"op": "add", "path": f"{path}/-", "value": item} for item in items)
    else:
        ops.append({"op": "add", "path": path, "value": items})
