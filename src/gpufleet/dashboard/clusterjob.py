"""A cluster job's page: what ``gpufleet status`` says, its pods by rank and node, the
conditions of the job, its Workload and its pods and their events, in time order, the pods'
last log lines, the loss and throughput curves from rank 0's log lines
(gpufleet.dashboard.curves), and its checkpoints where the dashboard can read them (an object
store): listed while it runs, verified once it has ended, with the curves of its kept logs.
Read when the page is asked for: a handful of reads for one job."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.cluster.access import as_dict, items
from gpufleet.cluster.apierrors import api_errors, server_message, status_code, to_cluster_error
from gpufleet.cluster.client import Cluster
from gpufleet.cluster.kinds import WORKLOADS
from gpufleet.cluster.resizes import describe, resizes
from gpufleet.cluster.status import ENDED, JobStatus
from gpufleet.dashboard.curves import Curves
from gpufleet.dashboard.history import entry, history_page
from gpufleet.kube import Obj
from gpufleet.render.podsecurity import pod_specs_in
from gpufleet.runtime import integrity
from gpufleet.runtime.context import kept_logs_root

TAIL = 100  # log lines per pod
# Where each controller writes a pod's rank: the Job controller's completion index, the
# training-operator's replica index.
RANK_KEYS = ("batch.kubernetes.io/job-completion-index", "training.kubeflow.org/replica-index")


@dataclass
class Moment:
    """One line of the job's timeline: a condition's transition or an event."""

    time: str
    what: str  # "Job", "Workload", "Pod x", ...
    kind: str  # Normal, Warning, or the condition's status
    reason: str
    message: str


@dataclass
class JobPage:
    """Everything a cluster job's page shows."""

    namespace: str
    name: str
    status: JobStatus
    ranks: dict[str, str]  # pod name -> its rank (index)
    timeline: list[Moment] = field(default_factory=list)
    logs: dict[str, list[str]] = field(default_factory=dict)
    curves: Curves = field(default_factory=Curves)
    kept_at: str | None = None  # where the job keeps its checkpoints and its ranks' logs
    steps: list[int] = field(default_factory=list)  # its checkpoints while it runs
    checkpoints: list[integrity.Entry] = field(default_factory=list)  # verified, once it ended
    kept_note: str = ""  # why they are not shown


def rank_of(pod: Obj) -> str:
    meta = pod["metadata"]
    found = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return next((str(found[k]) for k in RANK_KEYS if k in found), "-")


def _conditions(obj: Obj | None, what: str) -> list[Moment]:
    return [Moment(str(c.get("lastTransitionTime") or ""), what,
                   f"{c.get('type')}={c.get('status')}", str(c.get("reason") or ""),
                   str(c.get("message") or ""))
            for c in ((obj or {}).get("status") or {}).get("conditions") or []]  # fmt: skip


def _resizes(job: Obj) -> list[Moment]:
    """An elastic Job's resizes (gpufleet.cluster.elastic keeps them on it) as moments."""
    return [Moment(str(r.get("at") or ""), "Job", "Resized", str(r.get("cause") or ""),
                   describe(r)) for r in resizes(job)]  # fmt: skip


def job_page(
    cluster: Cluster, name: str, logs: bool = True, readable: tuple[str, ...] = ()
) -> JobPage | None:
    """The page of job ``name`` in the cluster's namespace; None when there is no such job.
    Without ``logs`` (a viewer who may not read the pods' logs), no logs and no curves."""
    found = cluster.find(name)
    if found is None:
        return None
    _, job = found
    status = cluster.status(name)
    pods = cluster.pods(name)
    page = JobPage(
        cluster.namespace, name, status, {p["metadata"]["name"]: rank_of(p) for p in pods}
    )
    workload = cluster.owned_by(WORKLOADS, job)
    page.timeline = _conditions(job, job.get("kind", "Job")) + _conditions(workload, "Workload")
    page.timeline += _resizes(job)
    page.timeline += [m for p in pods for m in _conditions(p, f"Pod {p['metadata']['name']}")]
    page.timeline += _events(cluster, {name, *page.ranks, *([workload["metadata"]["name"]]
                                                            if workload else [])})  # fmt: skip
    page.timeline.sort(key=lambda m: m.time)
    running = [p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded",
                                                                            "Failed")]  # fmt: skip
    for pod in running if logs else []:
        page.logs[pod["metadata"]["name"]] = _log(cluster, pod["metadata"]["name"])
    zero = [p for p, r in page.ranks.items() if r == "0" and p in page.logs]
    for pod_name in zero or list(page.logs)[:1]:
        page.curves.add(page.logs[pod_name])
    _kept(page, job, ended=status.phase in ENDED or not running, logs=logs, readable=readable)
    return page


def _kept_at(job: Obj) -> str | None:
    """Where the job's launchers keep their ranks' logs, beside its checkpoints (the worker's
    environment as rendered)."""
    for _, spec in pod_specs_in(job):
        for container in spec.get("containers") or []:
            env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
            if (found := kept_logs_root(env)) is not None:
                return found
    return None


def _kept(page: JobPage, job: Obj, *, ended: bool, logs: bool, readable: tuple[str, ...]) -> None:
    """The job's checkpoints where the dashboard was told to read (under its ``--history``
    locations, with its own credentials): their steps while it runs; once it has ended, each
    verified, and the curves from its ranks' kept logs when no pod is left to read."""
    page.kept_at = _kept_at(job)
    if page.kept_at is None:
        return
    where = page.kept_at.rstrip("/") + "/"
    if not any(where.startswith(location.rstrip("/") + "/") for location in readable):
        why = ("not under the dashboard's --history locations" if "://" in where
               else "on the job's volume, which the dashboard does not mount")  # fmt: skip
        page.kept_note = f"{why}: `gpufleet checkpoints verify`, `gpufleet logs {page.name} --kept`"
        return
    try:
        if not ended:
            page.steps = entry(page.kept_at).steps
            return
        past = history_page(page.kept_at)
    except Exception as exc:  # an object store's own errors (botocore's) are no OSError
        page.kept_note = f"not read: {type(exc).__name__}: {exc}"
        return
    page.steps, page.checkpoints = past.entry.steps, past.checkpoints
    if logs and not page.logs:
        page.curves = past.curves


def _log(cluster: Cluster, pod: str) -> list[str]:
    """The pod's last ``TAIL`` lines; a log that cannot be read (not started yet, its node's
    kubelet not answering) is one line saying why, and the rest of the page stands."""
    try:
        text = cluster.core.read_namespaced_pod_log(pod, cluster.namespace, tail_lines=TAIL)
    except api_errors() as exc:
        why = "no log yet" if status_code(exc) == 400 else f"log not read (HTTP {status_code(exc)})"
        return [f"({why}: {server_message(exc)})"]
    return str(text).splitlines()


def _events(cluster: Cluster, names: set[str]) -> list[Moment]:
    """The namespace's events about the job, its pods and its Workload."""
    try:
        listed = cluster.core.list_namespaced_event(cluster.namespace)
    except api_errors() as exc:
        raise to_cluster_error(exc, "list events") from exc
    out = []
    for event in (as_dict(e) for e in items(listed)):
        about = event.get("involvedObject") or {}
        if about.get("name") in names:
            when = event.get("lastTimestamp") or event.get("eventTime") or ""
            out.append(Moment(str(when), f"{about.get('kind')} {about.get('name')}",
                              str(event.get("type") or ""), str(event.get("reason") or ""),
                              str(event.get("message") or "")))  # fmt: skip
    return out
