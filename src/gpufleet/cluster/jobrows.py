"""``gpufleet jobs``: one row per job of a Fleet, whatever its target.

A row holds what a person scanning the fleet asks first: where it runs (target, queue), its
phase, how far it is and how long it has to go, how often it restarted, its age, and for a job
that waits the first reason ``gpufleet status`` gives (most useful first). Pure functions: the
Fleet (gpufleet.cluster.fleet) and the running jobs' metrics come in, rows go out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufleet.cluster.fleet import Fleet, status_of
from gpufleet.cluster.kinds import WORKLOADS, Kind
from gpufleet.cluster.progress import by_rank, progress_numbers
from gpufleet.cluster.replaced import split_replaced
from gpufleet.cluster.status import RUNNING, JobStatus
from gpufleet.console import camel_json
from gpufleet.kube import KUEUE_QUEUE_LABEL, Obj

# Phases of a job that has not started (or waits to start again): its row gives the reason.
WAITING = ("Queued", "Pending", "Suspended", "Starting")
METRICS_READERS = 8  # running jobs whose pods' metrics are read at once


@dataclass
class JobRow:
    """One job in ``gpufleet jobs`` (``-o json``: these fields, camelCase)."""

    namespace: str
    name: str
    target: str
    queue: str | None
    phase: str
    restarts: int
    created: str | None  # metadata.creationTimestamp
    age_seconds: float | None
    reason: str | None  # a waiting job's first reason
    step: int | None = None
    steps: int | None = None
    eta_seconds: float | None = None
    line: str = ""  # gpufleet status's line
    size: str | None = None  # an elastic job's size in its node range
    resizes: list[str] = field(default_factory=list)  # its resizes, oldest first

    def as_dict(self) -> Obj:
        as_json: Obj = camel_json(self)
        return as_json


def parse_time(stamp: str | None) -> dt.datetime | None:
    """An API timestamp (RFC 3339, ``Z`` or an offset) as an aware datetime; None if absent."""
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def age(seconds: float | None) -> str:
    """kubectl's short age: ``45s``, ``12m``, ``5h``, ``3d``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def queue_of(kind: Kind, job: Obj) -> str | None:
    """The Kueue LocalQueue the job was submitted to, or its Volcano queue."""
    labels = job["metadata"].get("labels") or {}
    if kind.group == "batch.volcano.sh":
        return (job.get("spec") or {}).get("queue") or None
    return labels.get(KUEUE_QUEUE_LABEL)


def group_restarts(job: Obj) -> int:
    """Restarts the job's controller made of all its pods: a JobSet's (``status.restarts``,
    counted against spec.maxRestarts) or Volcano's (``status.retryCount``)."""
    status = job.get("status") or {}
    return int(status.get("restarts") or 0) + int(status.get("retryCount") or 0)


def evictions(workload: Obj | None) -> int:
    """How often Kueue evicted (preempted) the job's Workload: its schedulingStats, else its
    requeue count."""
    status = (workload or {}).get("status") or {}
    counted = (status.get("schedulingStats") or {}).get("evictions") or []
    if counted:
        return sum(int(e.get("count", 0)) for e in counted)
    return int((status.get("requeueState") or {}).get("count") or 0)


def row_of(
    fleet: Fleet, kind: Kind, job: Obj, now: dt.datetime, metrics: list[str] | None = None
) -> JobRow:
    """The job's row; ``metrics``: its running pods' job metrics (Prometheus text), if read."""
    status: JobStatus = status_of(fleet, kind, job)
    created = job["metadata"].get("creationTimestamp")
    started = parse_time(created)
    # Containers restarted in place, pods their controller replaced, restarts of the whole
    # group (JobSet, Volcano) and Kueue's evictions.
    restarts = sum(p.restarts for p in status.pod_states) + group_restarts(job)
    restarts += len(split_replaced(fleet.pods_of(job))[1]) + evictions(fleet.owned(WORKLOADS, job))
    row = JobRow(
        namespace=job["metadata"].get("namespace", ""),
        name=job["metadata"]["name"],
        target=kind.target,
        queue=queue_of(kind, job),
        phase=status.phase,
        restarts=restarts,
        created=created,
        age_seconds=(now - started).total_seconds() if started else None,
        reason=status.reasons[0] if status.reasons and status.phase in WAITING else None,
        line=status.line(),
        size=status.size,
        resizes=status.resizes,
    )
    numbers = progress_numbers(by_rank(metrics)) if metrics else None
    if numbers is not None:
        row.step, total, row.eta_seconds = numbers
        row.steps = total or None
    return row


def fleet_rows(
    fleet: Fleet, now: dt.datetime, metrics_of: Callable[[list[Obj]], list[str]] | None = None
) -> list[JobRow]:
    """Every job's row; with ``metrics_of`` (a Cluster's ``job_metrics``), the progress of the
    jobs ``gpufleet status`` reads it for (Running, Restarting), ``METRICS_READERS`` at a time."""
    rows = [row_of(fleet, kind, job, now) for kind, job in fleet.jobs]
    running = [i for i, row in enumerate(rows) if row.phase in RUNNING]
    if metrics_of is None or not running:
        return rows

    def read(i: int) -> JobRow:
        kind, job = fleet.jobs[i]
        return row_of(fleet, kind, job, now, metrics_of(fleet.pods_of(job)))

    with ThreadPoolExecutor(METRICS_READERS) as pool:
        for i, row in zip(running, pool.map(read, running), strict=True):
            rows[i] = row
    return rows
