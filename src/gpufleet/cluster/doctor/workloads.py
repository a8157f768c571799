"""The platform chart's own workloads in ``gpufleet doctor``: each DaemonSet and Deployment the
chart installed (its helm.sh/chart label) ready, or one FAIL line a workload
with the kubelet's reason for its first pod that is not, and what to set (pure, from Facts)."""

from __future__ import annotations

import re

from gpufleet.cluster.doctor.facts import Facts, not_ready, platform_workloads
from gpufleet.cluster.doctor.findings import Finding, fail, ok, unreadable
from gpufleet.kube import Obj

CHECK = "platform"
COMPONENT_LABEL = "app.kubernetes.io/component"
# Waiting reasons that are a step of a pod's start, not why it cannot start.
_STARTING = {"ContainerCreating", "PodInitializing"}
# What to set for the reasons a platform pod cannot start that the chart's values decide:
# (pattern on the kubelet's reason, the fix).
HINTS = [
    (re.compile(r"pod-resources.*(not a directory|no such file)", re.I),
     "set monitoring.exporter.podResources.kubeletDir to the kubelet's root directory, or "
     "monitoring.exporter.podResources.enabled=false (no GPU-to-pod attribution)"),
    (re.compile(r"ErrImageNeverPull|ErrImagePull|ImagePullBackOff|InvalidImageName"),
     "the nodes cannot get the image: push it to a registry they pull from, or import it on "
     "each node (the local cluster: cluster up --image), or set the component's image values"),
    (re.compile(r"violates PodSecurity"),
     "the release namespace's Pod Security level refuses the pod: label it as the values "
     "comment says (monitoring.exporter.podResources needs privileged), or disable the option"),
    (re.compile(r"Insufficient|untolerated taint|didn't match", re.I),
     "no node can take the pod: see its nodeSelector, tolerations and requests in the values"),
]  # fmt: skip


def chart_workloads(facts: Facts) -> list[Finding]:
    """One OK line for a platform whose workloads are all ready, or a FAIL for each one that is
    not; nothing where the chart is not installed."""
    for key in ("daemonsets", "deployments", CHECK):
        if key in facts.errors:
            return [unreadable(CHECK, facts.errors[key])]
    workloads = platform_workloads(facts)
    if not workloads:
        return []
    short = [(k, w) for k, w in workloads if not_ready(k, w)]
    if not short:
        names = ", ".join(sorted(_name(k, w) for k, w in workloads))
        return [ok(CHECK, f"{len(workloads)} workloads ready: {names}")]
    return [_short(k, w, facts) for k, w in short]


def _short(kind: str, workload: Obj, facts: Facts) -> Finding:
    """The FAIL line of a workload short of ready pods: its first such pod's reason."""
    meta = workload["metadata"]
    component = (meta.get("labels") or {}).get(COMPONENT_LABEL) or meta["name"]
    selector = ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    pods = [p for p in facts.platform_pods
            if p["metadata"].get("namespace") == meta["namespace"]
            and selector.items() <= (p["metadata"].get("labels") or {}).items()]  # fmt: skip
    reasons = [(p, _reason(p, facts.platform_events)) for p in pods if not _ready(p)]
    reasons = [(p, r) for p, r in reasons if r]
    if reasons:
        pod, why = reasons[0]
        where = (pod.get("spec") or {}).get("nodeName") or "no node"
        detail = f"{_name(kind, workload)}: {component} on {where}: {why}"
    else:  # no pod at all: the controller's own events say why (a refused pod)
        why = _latest_warning(facts.platform_events, meta["name"]) or "no ready pod yet"
        detail = f"{_name(kind, workload)}: {component}: {why}"
    fix = next((hint for pattern, hint in HINTS if pattern.search(detail)), "")
    fix = fix or f"kubectl -n {meta['namespace']} describe pods -l " + ",".join(
        f"{k}={v}" for k, v in selector.items()
    )
    return fail(CHECK, detail, fix)


def _reason(pod: Obj, events: list[Obj]) -> str:
    """A not-ready pod's reason: a container's waiting reason, else the pod's newest warning
    event (a failed mount), else why it is not scheduled."""
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or []),
                  *(status.get("containerStatuses") or [])]  # fmt: skip
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in _STARTING:
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    warning = _latest_warning(events, pod["metadata"]["name"])
    if warning:
        return warning
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"not scheduled: {c.get('message', '')}"
    return ""


def _latest_warning(events: list[Obj], name: str) -> str:
    """The newest Warning event about the object ``name``: "<reason>: <message>"."""
    about = [e for e in events if e.get("type") == "Warning"
             and (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip
    if not about:
        return ""
    latest = max(about, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"{latest.get('reason', '')}: {latest.get('message', '')}"


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _name(kind: str, workload: Obj) -> str:
    return f"{kind} {workload['metadata']['namespace']}/{workload['metadata']['name']}"
