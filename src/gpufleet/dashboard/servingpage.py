"""The serving page: each InferenceService's Triton Deployment (replicas wanted and ready, the
one-line state ``gpufleet status`` gives) and its autoscaler's state: a HorizontalPodAutoscaler
(bounds, current and desired replicas, its metric against the target, why it cannot scale) or
a KEDA ScaledObject (bounds and its conditions); with a Prometheus, its requests per second and
their mean latency over the last minute, summed over its pods (gpufleet.dashboard.utilization).
Pure functions over the listed objects."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.cluster.fleet import ns_name
from gpufleet.cluster.queues import quantity
from gpufleet.cluster.status import summarize_service
from gpufleet.dashboard.utilization import PodTraffic, Traffic
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
    traffic: Traffic | None = None  # None: no Prometheus, or none of its pods scraped


def _note(condition: Obj) -> str:
    """``Type: Reason: message`` of a condition that is not as it should be."""
    parts = [condition.get("type"), condition.get("reason"), condition.get("message")]
    return ": ".join(str(p) for p in parts if p)


def _plain(value: object) -> str:
    """A metric's quantity as a plain number (``59m``: 0.059 of a per-request time in
    seconds); as it is when it is none."""
    try:
        return format(quantity(value).normalize(), "f")
    except ValueError:
        return str(value)


def _hpa(hpa: Obj) -> Autoscaler:
    spec, status = hpa.get("spec") or {}, hpa.get("status") or {}
    current = {(m.get("pods") or {}).get("metric", {}).get("name"): m
               for m in status.get("currentMetrics") or []}  # fmt: skip
    metrics = []
    for target in spec.get("metrics") or []:  # the adapter's per-pod metrics
        pods = target.get("pods") or {}
        name = (pods.get("metric") or {}).get("name", "?")
        now = ((current.get(name) or {}).get("pods") or {}).get("current") or {}
        want = (pods.get("target") or {}).get("averageValue")
        metrics.append(f"{name}: {_plain(now.get('averageValue', '?'))}"
                       + (f" / {_plain(want)}" if want is not None else ""))  # fmt: skip
    # ScalingLimited is the one condition whose True is the news; the others' False is
    notes = [_note(c) for c in status.get("conditions") or []
             if (c.get("type") == "ScalingLimited") == (c.get("status") == "True")]  # fmt: skip
    return Autoscaler("HorizontalPodAutoscaler", spec.get("minReplicas"), spec.get("maxReplicas"),
                      status.get("currentReplicas"), status.get("desiredReplicas"),
                      "; ".join(metrics), notes)  # fmt: skip


def _keda(scaled: Obj) -> Autoscaler:
    spec, status = scaled.get("spec") or {}, scaled.get("status") or {}
    # Ready False is news; Active False only means no traffic (scaled to its minimum)
    notes = [_note(c) for c in status.get("conditions") or []
             if c.get("type") == "Ready" and c.get("status") != "True"]  # fmt: skip
    return Autoscaler("ScaledObject", spec.get("minReplicaCount"), spec.get("maxReplicaCount"),
                      None, None, "", notes)  # fmt: skip


def _traffic(pods: list[Obj], traffic: PodTraffic | None) -> Traffic | None:
    """The traffic of a service's pods, summed (None: none of them is in Prometheus)."""
    if traffic is None or traffic.error:
        return None
    seen = [traffic.pods[key] for key in map(ns_name, pods) if key in traffic.pods]
    return sum(seen, Traffic()) if seen else None


def service_rows(deployments: list[Obj], pods: list[Obj], hpas: list[Obj], scaled: list[Obj],
                 traffic: PodTraffic | None = None) -> list[ServiceRow]:  # fmt: skip
    """Each InferenceService's row, by namespace and name."""
    scalers = {ns_name(h): _hpa(h) for h in hpas} | {ns_name(s): _keda(s) for s in scaled}
    rows = []
    for deployment in sorted(deployments, key=ns_name):
        ns, name = ns_name(deployment)
        mine = [p for p in pods if ns_name(p)[0] == ns
                and (p["metadata"].get("labels") or {}).get(LABEL_JOB) == name]  # fmt: skip
        status = summarize_service(deployment, mine)
        rows.append(ServiceRow(
            namespace=ns, name=name, phase=status.phase, line=status.line(),
            replicas=int((deployment.get("spec") or {}).get("replicas") or 0),
            ready=int((deployment.get("status") or {}).get("readyReplicas") or 0),
            autoscaler=scalers.get((ns, name)), traffic=_traffic(mine, traffic)))  # fmt: skip
    return rows
