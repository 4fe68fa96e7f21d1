"""AdmissionReview (admission.k8s.io/v1) in, AdmissionReview with a JSONPatch out.

What cannot be read as a review at all is a `BadReview` (HTTP 400). A review of something we
do not patch (not a Pod, not a create, a pod whose spec we cannot read) is allowed unchanged,
with a warning where something was odd: the webhook must never stand between a user and
their pod, and the API server admits it anyway when the webhook fails (failurePolicy Ignore).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Mapping

from llmmon.inject.owner import job_owner
from llmmon.inject.podpatch import JsonPatch, Settings, opted_in, pod_patch

API_VERSION = "admission.k8s.io/v1"
MAX_BODY = 4 * 1024 * 1024  # a pod is at most ~1.5 MiB in etcd; a review carries one or two


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request: answered 400 with this message."""


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionRequest the webhook reads."""

    uid: str
    kind: str  # the object's kind, e.g. "Pod"
    group: str
    operation: str
    namespace: str
    obj: Any


@dataclass(frozen=True)
class Outcome:
    """What the webhook answers: a patch (maybe empty), why, and warnings for the user."""

    patch: JsonPatch
    reason: str
    warnings: tuple[str, ...] = ()
    job_id: str = ""


def parse(body: bytes) -> Request:
    if len(body) > MAX_BODY:
        raise BadReview(f"body of {len(body)} bytes is over the {MAX_BODY}-byte limit")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting as deep as it fits
        raise BadReview(f"body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview":
        raise BadReview("body is not an AdmissionReview")
    if doc.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion {str(doc.get('apiVersion'))[:80]!r} is not {API_VERSION} "
                        "(set admissionReviewVersions: [v1])")
    request = doc.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) \
            or not request["uid"]:
        raise BadReview("AdmissionReview has no request with a uid")
    kind = request.get("kind") if isinstance(request.get("kind"), dict) else {}
    return Request(uid=request["uid"], kind=str(kind.get("kind", "")),
                   group=str(kind.get("group", "")),
                   operation=str(request.get("operation", "")),
                   namespace=str(request.get("namespace") or ""), obj=request.get("object"))


def decide(request: Request, settings: Settings, namespace_opted_in: bool) -> Outcome:
    """The patch for this request: empty unless it creates a Pod that opted in."""
    if (request.group, request.kind) != ("", "Pod") or request.operation != "CREATE":
        return Outcome([], f"not a pod creation ({request.operation} {request.kind})",
                       (f"llmmon: only pod creations are injected, not {request.kind[:40]}",)
                       if (request.group, request.kind) != ("", "Pod") else ())
    pod = request.obj
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(meta, dict) or not isinstance(pod.get("spec"), dict):
        return Outcome([], "no pod object", ("llmmon: no pod in the request; not injected",))
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    if not opted_in(labels, namespace_opted_in):
        return Outcome([], "not opted in")
    namespace = request.namespace or str(meta.get("namespace") or "default")
    try:
        ops = pod_patch(pod, namespace, settings)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return Outcome([], f"unreadable pod spec: {exc!r}"[:200],
                       ("llmmon: the pod spec could not be read; reporter not injected",))
    return Outcome(ops, "injected" if ops else "already injected",
                   job_id=job_owner(namespace, meta).job_id)


def response(uid: str, outcome: Outcome) -> dict[str, Any]:
    """The AdmissionReview the API server expects back: always allowed."""
    answer: dict[str, Any] = {"uid": uid, "allowed": True}
    if outcome.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(
            json.dumps(outcome.patch, separators=(",", ":")).encode()).decode()
    if outcome.warnings:
        answer["warnings"] = list(outcome.warnings)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}


def describe(request: Request) -> Mapping[str, str]:
    """Who asked, for the log line of each review."""
    meta = request.obj.get("metadata") if isinstance(request.obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return {"uid": request.uid[:64], "namespace": request.namespace[:64],
            "pod": str(meta.get("name") or meta.get("generateName") or "")[:64]}
