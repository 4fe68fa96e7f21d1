"""Which job a pod belongs to, from the labels its controller puts on every pod it makes.

The ranks of one job share a job id, so the id comes from the object that owns all of them
(the PyTorchJob, the JobSet, the Volcano Job ...), never from the pod. It is prefixed with the
namespace: two teams' `llama` jobs in two namespaces are two jobs. A namespace name has no dot
(it is a DNS label), so `<namespace>.<name>` is unambiguous and survives `layout.safe_job`.
Sources for each label are in docs/deployment.md (Zero-touch injection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"

# (label, owner kind), most specific first: a JobSet's pods also carry the label of the batch
# Job it made for them, and a Kubeflow Trainer TrainJob runs as a JobSet of its own name (whose
# label identifies it where the Trainer is too old to set its own).
JOB_LABELS: tuple[tuple[str, str], ...] = (
    ("training.kubeflow.org/job-name", "PyTorchJob"),
    ("trainer.kubeflow.org/trainjob-name", "TrainJob"),
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("volcano.sh/job-name", "Volcano Job"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)


@dataclass(frozen=True)
class Owner:
    """The job a pod's ranks report under: its id and where it was read from."""

    job_id: str
    kind: str
    source: str


def job_owner(namespace: str, metadata: Mapping[str, Any]) -> Owner:
    """The pod's job; a pod no known controller labelled is a job of its own (its controller
    from ownerReferences, else the pod itself)."""
    labels = metadata.get("labels") or {}
    labels = labels if isinstance(labels, Mapping) else {}
    name, group = _text(labels.get(LWS_NAME)), _text(labels.get(LWS_GROUP))
    pod = _text(metadata.get("name"))
    if name and not group and re.fullmatch(rf"{re.escape(name)}-\d+", pod):
        # A leader pod whose group label LWS's own webhook has not stamped yet: the leader
        # StatefulSet names it <lws>-<group>.
        group = pod.rsplit("-", 1)[1]
    if name and group:  # each LeaderWorkerSet group is a replica: a job of its own
        return Owner(f"{namespace}.{name}.{group}", "LeaderWorkerSet",
                     f"labels {LWS_NAME}, {LWS_GROUP}")
    for label, kind in JOB_LABELS:
        if value := _text(labels.get(label)):
            return Owner(f"{namespace}.{value}", kind, f"label {label}")
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and _text(ref.get("name")):
            return Owner(f"{namespace}.{ref['name']}", str(ref.get("kind", "")),
                         "ownerReferences")
    pod = pod or _text(metadata.get("generateName")).rstrip("-")
    return Owner(f"{namespace}.{pod or 'pod'}", "Pod", "the pod's name")


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""
