"""The serving page: each InferenceService's Triton Deployment (replicas wanted and ready, the
one-line state ``gpufleet status`` gives) and its autoscaler's state: a HorizontalPodAutoscaler
(bounds, current and desired replicas, its metric against the target, why it cannot scale) or
a KEDA ScaledObject (bounds and its conditions). Pure functions over the listed objects."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.cluster.status import summarize_service
from gpufleet.kube import LABEL_JOB, Obj


@dataclass
class Autoscaler:
    """What scales a service and where it stands."""

    kind: str  # HorizontalPodAutoscaler or ScaledObject
    min: int | None
    max: int | None
    current: int | None
    desired: int | None
    metric: str = ""  # "nv_inference_pending_request_count: 3 / 2"
    notes: list[str] = field(default_factory=list)  # conditions that are not as they should be


@dataclass
class ServiceRow:
    """One InferenceService."""

    namespace: str
    name: str
    phase: str
    line: str
    replicas: int
    ready: int
    autoscaler: Autoscaler | None


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _hpa(hpa: Obj) -> Autoscaler:
    spec, status = hpa.get("spec") or {}, hpa.get("status") or {}
    metric = ""
    for target, current in zip(spec.get("metrics") or [], status.get("currentMetrics") or [],
                               strict=False):  # fmt: skip
        pods, now = target.get("pods") or {}, (current.get("pods") or {}).get("current") or {}
        want = (pods.get("target") or {}).get("averageValue")
        metric = f"{(pods.get('metric') or {}).get('name', '?')}: {now.get('averageValue', '?')}"
        metric += f" / {want}" if want is not None else ""
    notes = [f"{c.get('type')}: {c.get('reason')}: {c.get('message', '')}".rstrip(": ")
             for c in status.get("conditions") or []
             if (c.get("type") == "ScalingLimited") == (c.get("status") == "True")]  # fmt: skip
    return Autoscaler("HorizontalPodAutoscaler", spec.get("minReplicas"), spec.get("maxReplicas"),
                      status.get("currentReplicas"), status.get("desiredReplicas"), metric,
                      notes)  # fmt: skip


def _keda(scaled: Obj) -> Autoscaler:
    spec, status = scaled.get("spec") or {}, scaled.get("status") or {}
    notes = [f"{c.get('type')}: {c.get('reason')}: {c.get('message', '')}".rstrip(": ")
             for c in status.get("conditions") or [] if c.get("status") != "True"
             and c.get("type") in ("Ready", "Active")]  # fmt: skip
    return Autoscaler("ScaledObject", spec.get("minReplicaCount"), spec.get("maxReplicaCount"),
                      None, None, "", notes)  # fmt: skip


def service_rows(deployments: list[Obj], pods: list[Obj], hpas: list[Obj],
                 scaled: list[Obj]) -> list[ServiceRow]:  # fmt: skip
    """Each InferenceService's row, by namespace and name."""
    scalers = {_key(h): _hpa(h) for h in hpas} | {_key(s): _keda(s) for s in scaled}
    rows = []
    for deployment in sorted(deployments, key=_key):
        ns, name = _key(deployment)
        mine = [p for p in pods if _key(p)[0] == ns
                and (p["metadata"].get("labels") or {}).get(LABEL_JOB) == name]  # fmt: skip
        status = summarize_service(deployment, mine)
        rows.append(ServiceRow(
            namespace=ns, name=name, phase=status.phase, line=status.line(),
            replicas=int((deployment.get("spec") or {}).get("replicas") or 0),
            ready=int((deployment.get("status") or {}).get("readyReplicas") or 0),
            autoscaler=scalers.get((ns, name))))  # fmt: skip
    return rows
