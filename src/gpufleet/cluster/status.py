"""Fold a job's API objects into one status line and say why it is not running.

Pure functions over the objects as the API server returns them (camelCase dicts), so the logic
is tested from recorded objects and the live client only fetches. The question users of Kueue,
JobSet, Kubeflow and Volcano ask most is "why is my job pending?"; the answer comes, in order,
from the job's own conditions, Kueue's Workload (and its ClusterQueue's usage), the Volcano
PodGroup, and the pods' scheduling conditions and events.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from gpufleet.cluster.imagecheck import image_problems
from gpufleet.cluster.phases import job_phase
from gpufleet.cluster.resizes import resize_lines, size_text
from gpufleet.kube import KUEUE_QUEUE_LABEL, Obj

# Phases of a job whose ranks serve the progress status reads (gpufleet.cluster.progress).
RUNNING = ("Running", "Restarting")
ENDED = ("Succeeded", "Failed")  # a job's or a pod's phases once it is over
_WAITING_PROBLEMS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
}


@dataclass(frozen=True)
class PodState:
    """One pod as its kubelet reports it: where it runs, its phase, how often its containers
    restarted, and the last exit code (of a container that ended, now or before a restart)."""

    name: str
    node: str
    phase: str
    restarts: int
    last_exit: int | None
    last_reason: str = ""

    @classmethod
    def of(cls, pod: Obj) -> PodState:
        status = pod.get("status") or {}
        statuses = status.get("containerStatuses") or []
        ended = [
            (cs.get("state") or {}).get("terminated")
            or (cs.get("lastState") or {}).get("terminated")
            for cs in statuses
        ]
        last = next((t for t in ended if t), None) or {}
        return cls(
            name=pod["metadata"]["name"],
            node=(pod.get("spec") or {}).get("nodeName") or "-",
            phase=status.get("phase", "Unknown"),
            restarts=sum(int(cs.get("restartCount", 0)) for cs in statuses),
            last_exit=last.get("exitCode"),
            last_reason=last.get("reason", ""),
        )

    def as_dict(self) -> Obj:
        return {"name": self.name, "node": self.node, "phase": self.phase,
                "restarts": self.restarts, "lastExitCode": self.last_exit,
                "lastReason": self.last_reason}  # fmt: skip

    def line(self) -> str:
        """``pod NAME on NODE: Phase, restarts N, last exit C (Reason)``."""
        text = f"pod {self.name} on {self.node}: {self.phase}, restarts {self.restarts}"
        if self.last_exit is not None:
            text += f", last exit {self.last_exit}"
            text += f" ({self.last_reason})" if self.last_reason else ""
        return text


@dataclass
class JobStatus:
    """What ``gpufleet status`` prints: a phase, pod counts and the reasons, most useful first."""

    name: str
    kind: str
    phase: str  # Queued, Pending, Starting, Running, Restarting, Suspended, Succeeded, Failed
    pods: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    pod_states: list[PodState] = field(default_factory=list)
    progress: str | None = None  # a running job's, from its ranks' metrics (cluster.progress)
    size: str | None = None  # an elastic job's: "1 of 1–2 nodes" (cluster.resizes)
    resizes: list[str] = field(default_factory=list)  # its resizes, oldest first

    def line(self) -> str:
        """One line: ``name (Kind): Phase, pods 1/2 Running; progress; reason; reason``; an
        elastic job's size and its last resize after the pods."""
        total = sum(self.pods.values())
        text = f"{self.name} ({self.kind}): {self.phase}"
        if total:
            text += f", pods {self.pods.get('Running', 0)}/{total} Running"
        elastic = [f"size {self.size}", *self.resizes[-1:]] if self.size else []
        return "; ".join([text, *elastic, *([self.progress] if self.progress else []),
                          *self.reasons])  # fmt: skip

    def as_dict(self) -> Obj:
        return {
            "name": self.name,
            "kind": self.kind,
            "phase": self.phase,
            "pods": self.pods,
            "reasons": self.reasons,
            "progress": self.progress,
            "size": self.size,
            "resizes": self.resizes,
            "line": self.line(),
            "podStates": [p.as_dict() for p in self.pod_states],
        }


def _cq_usage(cluster_queue: Obj) -> list[str]:
    """``nvidia.com/gpu in flavor a30: 8 of 8 used (0 borrowed)`` for each exhausted resource
    (not one the flavor has none of: a CPU flavor's GPUs are not "full")."""
    nominal: dict[tuple[str, str], str] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                nominal[(flavor["name"], res["name"])] = str(res.get("nominalQuota", "?"))
    out = []
    for flavor in (cluster_queue.get("status") or {}).get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            quota = nominal.get((flavor["name"], res["name"]))
            total = str(res.get("total", "0"))
            if quota is not None and total == quota and quota != "0":
                borrowed = res.get("borrowed", "0")
                out.append(
                    f"{res['name']} in flavor {flavor['name']}: {total} of {quota} used "
                    f"({borrowed} borrowed)"
                )
    return out


# Kinds gpufleet renders whose Kueue integration Kueue's own default configuration leaves
# out (config/components/manager/controller_manager_config.yaml of Kueue v0.19.2: pytorchjob
# and tfjob are commented out; batch/job, jobset, mpijob and trainjob are on).
KUEUE_OFF_BY_DEFAULT = {"PyTorchJob": "kubeflow.org/pytorchjob", "TFJob": "kubeflow.org/tfjob"}


def kueue_reasons(
    workload: Obj | None, local_queue: Obj | None, cluster_queue: Obj | None
) -> tuple[bool | None, list[str]]:
    """Whether Kueue admitted the job (None: no Workload) and, if not, why. An admitted job that
    Kueue is evicting (its pods still stopping, its quota not yet released) is admitted, with the
    eviction's line."""
    if workload is None:
        return None, []
    status = workload.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if conditions.get("QuotaReserved", {}).get("status") == "True" or status.get("admission"):
        admitted = conditions.get("Admitted", {}).get("status", "True") == "True"
        if admitted:
            return True, _eviction(conditions, {}, stopping=True)
        pending = conditions.get("Admitted", {})
        return False, [
            f"Kueue: quota reserved, waiting for admission checks: "
            f"{pending.get('message', '')}".rstrip(": ")
        ]
    reasons = []
    queue = (workload.get("spec") or {}).get("queueName", "?")
    cq_name = ((local_queue or {}).get("spec") or {}).get("clusterQueue")
    message = conditions.get("QuotaReserved", {}).get("message", "")
    where = f"LocalQueue {queue}" + (f" -> ClusterQueue {cq_name}" if cq_name else "")
    if local_queue is None and "doesn't exist" not in message:
        message = message or f"LocalQueue {queue} not found in the job's namespace"
    reasons.append(f"Kueue: waiting in {where}: {message or 'not yet evaluated'}")
    reasons += _eviction(conditions, status.get("requeueState") or {})
    if cluster_queue is not None:
        full = _cq_usage(cluster_queue)
        if full:
            reasons.append(f"ClusterQueue {cq_name} is full: " + ", ".join(full))
        inactive = [
            c
            for c in (cluster_queue.get("status") or {}).get("conditions") or []
            if c.get("type") == "Active" and c.get("status") == "False"
        ]
        for c in inactive:
            reasons.append(f"ClusterQueue {cq_name} is inactive: {c.get('message', '')}")
    return False, reasons


# Kueue's preemption message names the preemptor's queue by its cohort path: ".../<cq>".
PREEMPTOR = re.compile(r"preemptor path: (\S*?)/?([^/;\s]+)(?:;|$)")


def _eviction(conditions: dict[str, Obj], requeue: Obj, *, stopping: bool = False) -> list[str]:
    """One line for a preempted workload (by which ClusterQueue, why), or the eviction's (with
    Kueue's backoff: when it queues again, and how many times it was evicted). `stopping`: the
    workload still holds its quota while its pods end."""
    then = "; its pods are stopping, then it is requeued" if stopping else "; requeued"
    preempted = conditions.get("Preempted") or {}
    if preempted.get("status") == "True":
        message = preempted.get("message", "")
        match = PREEMPTOR.search(message)
        by = f" by a workload of ClusterQueue {match.group(2)}" if match else f": {message}"
        return [f"Kueue: preempted ({preempted.get('reason', '')}){by}{then}"]
    evicted = conditions.get("Evicted") or {}
    if evicted.get("status") == "True":
        line = f"Kueue: evicted ({evicted.get('reason', '')}): {evicted.get('message', '')}"
        line += "; its pods are stopping" if stopping else ""
        if requeue.get("requeueAt"):
            line += f"; its quota freed, queued again at {requeue['requeueAt']}"
            line += f" (eviction {requeue.get('count', 1)})"
        return [line]
    return []


_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([\w./-]+)")
_TAINT = re.compile(r"(\d+) node\(s\) had untolerated taint \{([^}]*)\}")


def explain_scheduling(message: str) -> str:
    """Turn the scheduler's ``0/5 nodes are available: ...`` into a short diagnosis."""
    parts = []
    for count, resource in _INSUFFICIENT.findall(message):
        parts.append(f"{count} node(s) without enough free {resource}")
    for count, taint in _TAINT.findall(message):
        parts.append(f"{count} node(s) with a taint the pod does not tolerate ({taint.strip()})")
    if "didn't match Pod's node affinity/selector" in message:
        parts.append("no node matches the pod's nodeSelector/affinity (GPU product label?)")
    if "unbound immediate PersistentVolumeClaims" in message or "persistentvolumeclaim" in message:
        parts.append("a PersistentVolumeClaim is not bound")
    return "; ".join(parts) if parts else message


def pod_reasons(pods: list[Obj], events: list[Obj]) -> list[str]:
    """Why pods are not running: unschedulable (with the scheduler's words), bad images, crashes."""
    latest: dict[str, str] = {}
    for ev in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
        if ev.get("reason") == "FailedScheduling":
            latest[(ev.get("involvedObject") or {}).get("name", "")] = ev.get("message", "")
    # What an image lacks says more than its exit code: once, for the first pod that shows it.
    problems = image_problems(pods)
    reasons = [f"pod {where[0]}: {line}" for line, where in problems.items()]
    troubled = {name for where in problems.values() for name in where}
    seen: set[str] = set()
    for pod in pods:
        name = pod["metadata"]["name"]
        if name in troubled:
            continue
        status = pod.get("status") or {}
        message = ""
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message") or cond.get("reason") or ""
        message = latest.get(name, message)
        if message:
            text = f"unschedulable: {explain_scheduling(message)} (scheduler: {message})"
            if text not in seen:
                seen.add(text)
                reasons.append(f"pod {name} {text}")
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_PROBLEMS:
                reasons.append(
                    f"pod {name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
                )
            terminated = (cs.get("lastState") or {}).get("terminated") or {}
            if terminated.get("exitCode") not in (None, 0):
                reasons.append(
                    f"pod {name}: container last exited {terminated['exitCode']} "
                    f"({terminated.get('reason', '')}), restarts {cs.get('restartCount', 0)}"
                )
    return reasons


# The event reasons of a controller whose pod the API server refused: the Job, JobSet and
# ReplicaSet controllers' FailedCreate, the training-operator's FailedCreatePod
# (pkg/controller.v1/control/pod_control.go).
FAILED_CREATE_REASONS = ("FailedCreate", "FailedCreatePod")


def refused_pods(events: list[Obj]) -> list[str]:
    """A controller's FailedCreate: pods the API server refused (quota, PodSecurity); the
    latest message, once."""
    failed = [e for e in events if e.get("reason") in FAILED_CREATE_REASONS]
    if not failed:
        return []
    latest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    kind = (latest.get("involvedObject") or {}).get("kind", "controller")
    return [f"the {kind} controller cannot create pods: {latest.get('message', '')}"]


def podgroup_reasons(podgroup: Obj | None) -> list[str]:
    """Volcano's gang verdict: ``1/2 tasks in gang unschedulable: ...``."""
    if podgroup is None:
        return []
    out = []
    for cond in (podgroup.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Unschedulable" and cond.get("status") == "True":
            out.append(
                f"Volcano gang (PodGroup {podgroup['metadata']['name']}): {cond.get('message', '')}"
            )
    return out


def summarize(
    job: Obj,
    pods: list[Obj],
    events: list[Obj] | None = None,
    *,
    workload: Obj | None = None,
    local_queue: Obj | None = None,
    cluster_queue: Obj | None = None,
    podgroup: Obj | None = None,
) -> JobStatus:
    """Everything about one job in one JobStatus."""
    name = job["metadata"]["name"]
    phase, message = job_phase(job)
    counts = Counter((p.get("status") or {}).get("phase", "Unknown") for p in pods)
    status = JobStatus(
        name=name,
        kind=job.get("kind", "?"),
        phase=phase or "Pending",
        pods=dict(sorted(counts.items())),
        pod_states=sorted((PodState.of(p) for p in pods), key=lambda p: p.name),
        size=size_text(job),
        resizes=resize_lines(job),
    )
    if phase in ENDED:
        if message:
            status.reasons.append(message)
        if phase == "Failed":
            status.reasons += pod_reasons(pods, events or [])
        return status
    admitted, why = kueue_reasons(workload, local_queue, cluster_queue)
    labels = job["metadata"].get("labels") or {}
    status.reasons += why
    if admitted is False:
        status.phase = "Queued"
    elif admitted is None and KUEUE_QUEUE_LABEL in labels and phase == "Suspended":
        status.phase = "Queued"
        integration = KUEUE_OFF_BY_DEFAULT.get(job.get("kind", ""))
        status.reasons.append(
            f"Kueue has made no Workload for it: its {integration} integration is off in "
            "Kueue's default configuration; add it to integrations.frameworks in Kueue's "
            "Configuration (kueue-manager-config) and restart Kueue"
            if integration
            else "Kueue has made no Workload for it: is Kueue installed and managing this "
            "kind, and does the LocalQueue exist?"
        )
    problems = podgroup_reasons(podgroup) + pod_reasons(pods, events or [])
    problems += refused_pods(events or [])
    status.reasons += problems
    if status.phase in ("Pending", "Running", "Restarting") and pods:
        running = counts.get("Running", 0)
        if problems and running < len(pods):
            status.phase = "Pending"
        elif running == len(pods):
            status.phase = "Running" if phase != "Restarting" else "Restarting"
        else:
            status.phase = "Starting"
    elif phase == "Suspended" and status.phase != "Queued":
        status.reasons.append("suspended (spec.suspend is true)")
    return status


def summarize_service(
    deployment: Obj, pods: list[Obj], events: list[Obj] | None = None
) -> JobStatus:
    """An InferenceService's Triton Deployment: Serving, Degraded, Starting or Pending."""
    want = int((deployment.get("spec") or {}).get("replicas") or 0)
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    counts = Counter((p.get("status") or {}).get("phase", "Unknown") for p in pods)
    status = JobStatus(
        name=deployment["metadata"]["name"],
        kind="InferenceService/Deployment",
        phase="Serving",
        pods=dict(sorted(counts.items())),
    )
    problems = pod_reasons(pods, events or [])
    if want == 0:
        status.phase = "ScaledToZero"
    elif ready >= want:
        status.phase = "Serving"
    elif ready > 0:
        status.phase = "Degraded"
    else:
        status.phase = "Pending" if problems else "Starting"
    status.reasons.append(f"{ready}/{want} replicas ready")
    status.reasons += problems
    return status
