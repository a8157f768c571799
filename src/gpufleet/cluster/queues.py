"""``gpufleet queues``: Kueue's ClusterQueues and LocalQueues as the caller sees them, and where
each of the caller's waiting jobs stands.

Per ClusterQueue and flavor: nominal quota, used, borrowed and lendable. Kueue reports no
lendable amount (its status has ``total`` and ``borrowed``); it is computed as Kueue's
``lendingLimit`` reads: the unused part of the queue's own quota, at most ``lendingLimit``.

A waiting job's position is computed with Kueue's own order (v0.19.2,
pkg/cache/queue/cluster_queue.go ``baseCompareFunc``): higher ``spec.priority`` first, then the
earlier queue-order time (``GetQueueOrderTimestamp``: the Evicted condition's time after an
eviction for PodsReadyTimeout or an admission check, else the creation time), then the UID. The
order is over the pending Workloads the caller may read; where the ClusterQueue counts more
pending than that, the position is a lower bound (``exact`` false). Kueue's visibility API would
give it for every queue, but it needs a grant per user and is off in the local control plane.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

from gpufleet.cluster.fleet import Fleet
from gpufleet.cluster.jobrows import parse_time
from gpufleet.kube import Obj

# Evictions after which Kueue orders a workload by the eviction's time, not its creation.
EVICTION_ORDERED = ("PodsReadyTimeout", "AdmissionCheck")
_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "k", "M", "G", "T", "P", "m")
# Each kind of suffix, largest first: a quantity steps down its own kind to a whole number.
_KINDS = (("Pi", "Ti", "Gi", "Mi", "Ki", ""), ("P", "T", "G", "M", "k", ""))


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def quantity(text: object) -> Decimal:
    """A Kubernetes quantity (``256Gi``, ``20m``) as a number; ValueError when it is none."""
    from kubernetes.utils import parse_quantity

    return Decimal(parse_quantity(str(text)))  # type: ignore[no-untyped-call]


def _in_units_of(value: Decimal, like: str) -> str:
    """``value`` written with the suffix of ``like`` (a quantity such as ``256Gi``), or with
    the next smaller one of its kind where that is no whole number (6Ti less 16Gi is
    ``6128Gi``, not ``5.984375Ti``)."""
    suffix = next((s for s in _SUFFIXES if like.endswith(s)), "")
    kind = next((k for k in _KINDS if suffix in k), (suffix,)) if suffix else ("",)
    for unit in kind[kind.index(suffix) :]:
        scaled = value / quantity(f"1{unit}") if unit else value
        if scaled == scaled.to_integral_value():
            return f"{scaled.to_integral_value():f}{unit}"
    scaled = value / quantity(f"1{suffix}") if suffix else value  # no whole number: as it is
    return f"{scaled.normalize():f}{suffix}"


@dataclass
class FlavorQuota:
    """One resource of one flavor of a ClusterQueue."""

    flavor: str
    resource: str
    nominal: str
    used: str
    borrowed: str
    lendable: str
    borrowing_limit: str | None = None
    lending_limit: str | None = None


@dataclass
class QueueCounts:
    """A ClusterQueue or LocalQueue: its workloads by state."""

    name: str
    pending: int
    admitted: int
    reserving: int
    namespace: str | None = None  # a LocalQueue's
    cluster_queue: str | None = None  # a LocalQueue's, or a ClusterQueue's cohort below
    cohort: str | None = None
    inactive: str | None = None  # why a ClusterQueue is not active
    quota: list[FlavorQuota] = field(default_factory=list)


@dataclass
class WaitingJob:
    """One of the caller's pending Workloads and where it stands in its ClusterQueue."""

    namespace: str
    job: str
    workload: str
    local_queue: str
    cluster_queue: str | None
    priority: int
    position: int | None  # 1-based, in Kueue's order; None outside any ClusterQueue
    of: int  # pending workloads ahead of and behind it that the caller sees, itself included
    exact: bool  # the caller sees every pending workload of the ClusterQueue
    waited_seconds: float | None
    reason: str


def counts(queue: Obj, *, local: bool) -> QueueCounts:
    """A queue's counts (and for a ClusterQueue its quota per flavor and resource)."""
    spec, status = queue.get("spec") or {}, queue.get("status") or {}
    inactive = _conditions(queue).get("Active") or {}
    result = QueueCounts(
        name=queue["metadata"]["name"],
        pending=int(status.get("pendingWorkloads") or 0),
        admitted=int(status.get("admittedWorkloads") or 0),
        reserving=int(status.get("reservingWorkloads") or 0),
        namespace=queue["metadata"].get("namespace") if local else None,
        cluster_queue=spec.get("clusterQueue") if local else None,
        cohort=None if local else spec.get("cohortName"),
        inactive=inactive.get("message") or inactive.get("reason")
        if inactive.get("status") == "False" else None,
    )  # fmt: skip
    if not local:
        result.quota = quota(queue)
    return result


def quota(cluster_queue: Obj) -> list[FlavorQuota]:
    """Each flavor's resources: nominal, used (admitted workloads), borrowed, lendable."""
    usage = {(f["name"], r["name"]): r
             for f in (cluster_queue.get("status") or {}).get("flavorsUsage") or []
             for r in f.get("resources") or []}  # fmt: skip
    rows = []
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                nominal = str(res.get("nominalQuota", "0"))
                used = usage.get((flavor["name"], res["name"])) or {}
                total, borrowed = str(used.get("total", "0")), str(used.get("borrowed", "0"))
                own = quantity(total) - quantity(borrowed)
                lendable = max(Decimal(0), quantity(nominal) - own)
                limit = res.get("lendingLimit")
                if limit is not None:
                    lendable = min(lendable, quantity(limit))
                rows.append(FlavorQuota(
                    flavor=flavor["name"], resource=res["name"], nominal=nominal, used=total,
                    borrowed=borrowed, lendable=_in_units_of(lendable, nominal),
                    borrowing_limit=_str(res.get("borrowingLimit")),
                    lending_limit=_str(limit)))  # fmt: skip
    return rows


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def pending(workload: Obj) -> bool:
    """Waiting for quota: not reserved, not finished, not deactivated."""
    conditions = _conditions(workload)
    done = any(conditions.get(c, {}).get("status") == "True" for c in ("QuotaReserved", "Finished"))
    return not done and (workload.get("spec") or {}).get("active", True) is not False


def order_time(workload: Obj) -> str:
    """Kueue's queue-order timestamp (RFC 3339; they sort as text)."""
    evicted = _conditions(workload).get("Evicted") or {}
    if evicted.get("status") == "True" and evicted.get("reason") in EVICTION_ORDERED:
        return str(evicted.get("lastTransitionTime") or "")
    return str(workload["metadata"].get("creationTimestamp") or "")


def waiting_jobs(fleet: Fleet, now: dt.datetime) -> list[WaitingJob]:
    """The pending Workloads the caller sees, with their positions, per ClusterQueue in order."""
    by_queue: dict[str | None, list[Obj]] = {}
    for wl in filter(pending, fleet.workloads):
        ns = wl["metadata"].get("namespace", "")
        lq = fleet.local_queue(ns, (wl.get("spec") or {}).get("queueName", ""))
        by_queue.setdefault(((lq or {}).get("spec") or {}).get("clusterQueue"), []).append(wl)
    out = []
    for cq_name, workloads in sorted(by_queue.items(), key=lambda kv: kv[0] or ""):
        workloads.sort(key=lambda w: (-int((w.get("spec") or {}).get("priority") or 0),
                                      order_time(w), w["metadata"].get("uid", "")))  # fmt: skip
        cq = fleet.cluster_queue(cq_name)
        total = int(((cq or {}).get("status") or {}).get("pendingWorkloads") or 0)
        for position, wl in enumerate(workloads, 1):  # no ClusterQueue: in no line at all
            out.append(_waiting(wl, cq_name, position if cq_name else None, len(workloads),
                                total, now))  # fmt: skip
    return out


def _waiting(wl: Obj, cq: str | None, position: int | None, seen: int, total: int,
             now: dt.datetime) -> WaitingJob:  # fmt: skip
    meta, spec = wl["metadata"], wl.get("spec") or {}
    owner: Obj = next(iter(meta.get("ownerReferences") or []), {})
    reserved = _conditions(wl).get("QuotaReserved") or {}
    since = parse_time(reserved.get("lastTransitionTime") or meta.get("creationTimestamp"))
    return WaitingJob(
        namespace=meta.get("namespace", ""), job=owner.get("name", meta["name"]),
        workload=meta["name"], local_queue=spec.get("queueName", ""), cluster_queue=cq,
        priority=int(spec.get("priority") or 0), position=position, of=max(seen, total),
        exact=seen >= total, waited_seconds=(now - since).total_seconds() if since else None,
        reason=reserved.get("message") or "not yet evaluated by Kueue")  # fmt: skip
