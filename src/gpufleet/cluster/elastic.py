"""The elastic controller's decisions: which elastic Job to resize, to what, and why.

Kueue (v0.19, ElasticJobsViaWorkloadSlices, Beta, on by default) admits a change of size that
someone else makes to a Job carrying ``kueue.x-k8s.io/elastic-job``: a larger parallelism is a
new slice admitted for the difference; a smaller one gives quota back at once. Nothing in Kueue
grows a job when quota frees (kueue#9891), and a preemption evicts the whole Workload, which
then waits to be admitted again at the size it last had. gpufleet's controller closes both:

- **grow**: a running job below ``spec.nodes`` grows to the largest size the free quota of its
  ClusterQueue (and what it may borrow in its cohort) holds, once no slice of it is pending and
  all its pods are Ready (Kueue's PodsReady), and never in a topology-aware flavor (``settled``);
  only into idle quota: while a workload that its cohort could ever admit waits there, that
  workload comes first (``waiting_pools``), as Kueue's queue would have it;
- **readmit smaller**: a job that waits, suspended (never admitted, or evicted), at a size that
  does not fit is set to the largest size that does, at least ``spec.minNodes``, so that Kueue
  admits it at once instead of after the whole size frees.

Only free quota counts: a scale-up that Kueue could not admit at once would leave a pending
slice, and Kueue 0.19.2 lets pods run without quota when the old slice is evicted meanwhile
(fixed after it, kueue#15661). The quota math is Kueue's for a flat cohort (pkg/cache:
a ClusterQueue's own unused guaranteed quota plus the cohort's unused lendable quota, capped by
its borrowingLimit). Pure functions over the API's objects; the loop is ``elastic_loop``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from gpufleet.cluster.queues import pending, quantity
from gpufleet.cluster.resizes import KEPT_RESIZES, node_range, resizes
from gpufleet.cluster.status import PREEMPTOR
from gpufleet.kube import (
    ANNOTATION_NODE_RANGE,
    ANNOTATION_RESIZES,
    KUEUE_ELASTIC_JOB,
    KUEUE_QUEUE_LABEL,
    Obj,
)


@dataclass(frozen=True)
class Resize:
    """One decision: set the Job's parallelism (and completions) from ``old`` to ``new``."""

    namespace: str
    name: str
    old: int
    new: int
    cause: str


@dataclass(frozen=True)
class ElasticJob:
    """An elastic Job as the controller reads it."""

    obj: Obj
    namespace: str
    name: str
    size: int
    low: int
    high: int
    queue: str
    per_pod: dict[str, Decimal]

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"].get("uid", ""))


def _true(conditions: Iterable[Obj], kind: str) -> Obj | None:
    return next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"),
                None)  # fmt: skip


def _conditions(obj: Obj) -> list[Obj]:
    return list((obj.get("status") or {}).get("conditions") or [])


def pod_requests(template: Obj) -> dict[str, Decimal]:
    """One pod of ``template`` as its spec asks: its containers' requests summed (limits where
    a request is missing, as Kubernetes defaults them), and one ``pods``. What Kueue counts
    may be more (``counted``)."""
    total: dict[str, Decimal] = {"pods": Decimal(1)}
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    return total


def counted(workload: Obj) -> list[tuple[int, dict[str, Decimal]]]:
    """Each pod set of ``workload`` as Kueue counts it against quota: (pods, one pod's
    resources). Kueue adds the namespace's LimitRange defaults and the RuntimeClass's overhead
    to what the pod spec asks (workload.AdjustResources) and records the totals: the
    admission's ``resourceUsage`` once admitted, else ``status.resourceRequests`` once it was
    considered. The templates (``pod_requests``) only before either."""
    status = workload.get("status") or {}
    sets = (workload.get("spec") or {}).get("podSets") or []
    counts = {s.get("name", "main"): int(s.get("count") or 1) for s in sets}
    assigned = (status.get("admission") or {}).get("podSetAssignments") or []
    if any(a.get("resourceUsage") for a in assigned):
        return [_each(a["resourceUsage"], a.get("count") or counts.get(a.get("name", "main"), 1))
                for a in assigned if a.get("resourceUsage")]  # fmt: skip
    asked = [r for r in status.get("resourceRequests") or [] if r.get("resources")]
    if asked:
        return [_each(r["resources"], counts.get(r.get("name", "main"), 1)) for r in asked]
    return [(int(s.get("count") or 1), pod_requests(s.get("template") or {})) for s in sets]


def _each(total: Obj, pods: int) -> tuple[int, dict[str, Decimal]]:
    """(pods, one pod's share of ``total``, with its one ``pods``)."""
    pods = max(int(pods), 1)
    share = {name: quantity(value) / pods for name, value in total.items()}
    return pods, {**share, "pods": Decimal(1)}


def elastic_job(job: Obj) -> ElasticJob | None:
    """``job`` (a batch/v1 Job) as an elastic job, or None: not elastic, finished, queue-less or
    with a node range that is not ``MIN:MAX``."""
    meta, spec = job["metadata"], job.get("spec") or {}
    annotations = meta.get("annotations") or {}
    span = node_range(annotations.get(ANNOTATION_NODE_RANGE, ""))
    queue = (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    done = any(_true(_conditions(job), kind) for kind in ("Complete", "Failed"))
    if annotations.get(KUEUE_ELASTIC_JOB) != "true" or span is None or not queue or done:
        return None
    return ElasticJob(obj=job, namespace=meta["namespace"], name=meta["name"],
                      size=int(spec.get("parallelism") or 0), low=span[0], high=span[1],
                      queue=queue, per_pod=pod_requests(spec.get("template") or {}))  # fmt: skip


@dataclass(frozen=True)
class Quota:
    """One resource of one flavor of a ClusterQueue: its limits and what it holds."""

    nominal: Decimal
    borrowing_limit: Decimal | None
    lending_limit: Decimal | None
    used: Decimal

    @property
    def guaranteed(self) -> Decimal:
        """What only this queue may use: nominal less what it may lend."""
        if self.lending_limit is None:
            return Decimal(0)
        return max(Decimal(0), self.nominal - self.lending_limit)

    @property
    def lendable(self) -> Decimal:
        return self.nominal - self.guaranteed


def quotas(cluster_queue: Obj) -> dict[tuple[str, str], Quota]:
    """(flavor, resource) -> Quota of a ClusterQueue; usage is its reserved quota
    (status.flavorsReservation: admitted workloads and those holding a reservation)."""
    status = cluster_queue.get("status") or {}
    reserved = {(f["name"], r["name"]): quantity(r.get("total", "0"))
                for f in status.get("flavorsReservation") or status.get("flavorsUsage") or []
                for r in f.get("resources") or []}  # fmt: skip
    out = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                key = (flavor["name"], res["name"])
                borrow, lend = res.get("borrowingLimit"), res.get("lendingLimit")
                out[key] = Quota(
                    nominal=quantity(res.get("nominalQuota", "0")),
                    borrowing_limit=None if borrow is None else quantity(borrow),
                    lending_limit=None if lend is None else quantity(lend),
                    used=reserved.get(key, Decimal(0)))  # fmt: skip
    return out


def flavor_order(cluster_queue: Obj) -> list[str]:
    """The ClusterQueue's flavors in the order Kueue tries them."""
    return [f["name"] for g in (cluster_queue.get("spec") or {}).get("resourceGroups") or []
            for f in g.get("flavors") or []]  # fmt: skip


def available(name: str, key: tuple[str, str], cluster_queues: dict[str, Obj]) -> Decimal:
    """How much of ``key`` (flavor, resource) a workload of ClusterQueue ``name`` could be
    admitted with now: its own unused guaranteed quota, plus the cohort's unused lendable
    quota (every member's lendable part, less what members use beyond their guaranteed
    part), at most what its borrowingLimit leaves; without a cohort, nominal less used."""
    own = quotas(cluster_queues[name]).get(key)
    if own is None:
        return Decimal(0)
    cohort = (cluster_queues[name].get("spec") or {}).get("cohortName")
    if not cohort:
        return max(Decimal(0), own.nominal - own.used)
    members = [quotas(q).get(key) for q in cluster_queues.values()
               if (q.get("spec") or {}).get("cohortName") == cohort]  # fmt: skip
    pool = sum((m.lendable for m in members if m), Decimal(0))
    pooled = sum((max(Decimal(0), m.used - m.guaranteed) for m in members if m), Decimal(0))
    free = max(Decimal(0), own.guaranteed - own.used) + max(Decimal(0), pool - pooled)
    if own.borrowing_limit is not None:
        free = min(free, own.nominal + own.borrowing_limit - own.used)
    return max(Decimal(0), free)


def pods_that_fit(per_pod: dict[str, Decimal], cq: str, flavors: dict[str, str] | str,
                  cluster_queues: dict[str, Obj]) -> int:  # fmt: skip
    """How many more pods asking ``per_pod`` the free quota holds, each resource in its flavor
    (``flavors``: resource -> flavor, as Kueue assigned them; or one flavor for all). A resource
    the ClusterQueue does not cover there: none (Kueue would not admit it), but ``pods``."""
    covered = set(quotas(cluster_queues[cq]))
    fits = []
    for resource, each in per_pod.items():
        flavor = flavors if isinstance(flavors, str) else flavors.get(resource, "")
        if each <= 0 or (resource == "pods" and (flavor, resource) not in covered):
            continue
        if (flavor, resource) not in covered:
            return 0
        fits.append(int(available(cq, (flavor, resource), cluster_queues) // each))
    return min(fits, default=0)


def _workloads_of(job: ElasticJob, workloads: list[Obj]) -> list[Obj]:
    """The job's Workloads that are not finished (its slices)."""
    return [w for w in workloads
            if any(o.get("uid") == job.uid for o in w["metadata"].get("ownerReferences") or [])
            and not _true(_conditions(w), "Finished")]  # fmt: skip


def _admitted_flavors(workload: Obj) -> dict[str, str]:
    """The flavor Kueue assigned each resource of the workload's (first) pod set."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments")
    return dict((assignments or [{}])[0].get("flavors") or {})


def settled(workload: Obj) -> bool:
    """Whether an admitted slice may grow: its pods all Ready, not placed by topology.

    - PodsReady not False: a slice whose pods are not all Ready is within waitForPodsReady's
      timeout, and a scale-up is a new Workload whose clock starts again; a job grown while
      it starts is evicted whole when the new clock runs out (seen: the churn benchmark's
      jobs thrashed). Kueue keeps the condition only with waitForPodsReady on.
    - No topologyAssignment: Kueue 0.19.2's TAS ungater expects the new pods under the new
      slice's name but sees them under the first slice's (their template's workload
      annotation, which a running Job cannot change: tas/topology_ungater.go), so the pods
      that its first pass misses stay gated until the whole job is evicted."""
    ready = next((c for c in _conditions(workload) if c.get("type") == "PodsReady"), None)
    if ready is not None and ready.get("status") == "False":
        return False
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments")
    return not any(a.get("topologyAssignment") for a in assignments or [])


def _pool(cq: str, cluster_queues: dict[str, Obj]) -> str:
    """Where ``cq`` shares quota: its cohort, or itself."""
    return str((cluster_queues[cq].get("spec") or {}).get("cohortName") or cq)


def demand(workload: Obj) -> dict[str, Decimal]:
    """What the whole Workload holds or asks for, as Kueue counts it (``counted``)."""
    total: dict[str, Decimal] = {}
    for pods, each in counted(workload):
        for name, value in each.items():
            total[name] = total.get(name, Decimal(0)) + value * pods
    return total


def per_pod(job: ElasticJob, slices: list[Obj]) -> dict[str, Decimal]:
    """One pod of ``job`` as Kueue counts it: its newest slice's first pod set (``counted``),
    or its template's requests while it has no slice."""
    newest = max(slices, key=lambda w: w["metadata"].get("creationTimestamp") or "", default=None)
    sets = counted(newest) if newest is not None else []
    return sets[0][1] if sets else job.per_pod


def idle(cluster_queues: dict[str, Obj]) -> dict[str, Obj]:
    """The ClusterQueues as if nothing held any of their quota."""
    return {name: {**q, "status": {}} for name, q in cluster_queues.items()}


def waiting_pools(workloads: list[Obj], local_queues: dict[tuple[str, str], Obj],
                  cluster_queues: dict[str, Obj]) -> set[str]:  # fmt: skip
    """The cohorts (or lone ClusterQueues) where a Workload waits for quota that they could
    ever give it: no job grows there. One that asks for more than its cohort holds waits for
    ever, and does not stop the others growing."""
    pools, empty = set(), idle(cluster_queues)
    for workload in filter(pending, workloads):
        lq = local_queues.get((workload["metadata"].get("namespace", ""),
                               (workload.get("spec") or {}).get("queueName", "")))  # fmt: skip
        cq = ((lq or {}).get("spec") or {}).get("clusterQueue")
        if cq in cluster_queues and any(pods_that_fit(demand(workload), cq, flavor, empty)
                                        for flavor in flavor_order(empty[cq])):  # fmt: skip
            pools.add(_pool(cq, cluster_queues))
    return pools


def cohort_cause(cq: str, cluster_queues: dict[str, Obj]) -> str:
    cohort = (cluster_queues[cq].get("spec") or {}).get("cohortName")
    return f"quota freed in cohort {cohort}" if cohort else f"quota freed in {cq}"


def eviction_cause(workloads: list[Obj]) -> str:
    """Why the job waits at a size that does not fit: the newest preemption's preemptor
    (``reclaimed by product``, Kueue's reclaimWithinCohort; ``preempted by ...``), another
    eviction's reason, or none (never admitted)."""
    stops = [
        c
        for w in workloads
        for c in _conditions(w)
        if c.get("type") in ("Preempted", "Evicted") and c.get("status") == "True"
    ]
    if not stops:
        return "admitted at the size that fits"
    last = max(stops, key=lambda c: (c.get("lastTransitionTime") or "", c["type"] == "Preempted"))
    message = last.get("message") or ""
    preemptor = PREEMPTOR.search(message)
    if preemptor and "reclamation" in message:
        return f"reclaimed by {preemptor.group(2)}"
    if preemptor:
        return f"preempted by {preemptor.group(2)}"
    return f"evicted ({last.get('reason') or 'by Kueue'})"


def decide(job: ElasticJob, workloads: list[Obj], local_queues: dict[tuple[str, str], Obj],
           cluster_queues: dict[str, Obj]) -> Resize | None:  # fmt: skip
    """The resize ``job`` needs now, or None."""
    lq = local_queues.get((job.namespace, job.queue))
    cq = ((lq or {}).get("spec") or {}).get("clusterQueue")
    if cq not in cluster_queues:
        return None
    mine = _workloads_of(job, workloads)
    admitted = [w for w in mine if _true(_conditions(w), "Admitted")]
    suspended = bool((job.obj.get("spec") or {}).get("suspend"))
    grows = admitted and len(admitted) == len(mine) and all(map(settled, admitted))
    if grows and not suspended and job.size < job.high:
        flavors = _admitted_flavors(admitted[-1])  # a new slice keeps its flavors
        more = pods_that_fit(per_pod(job, mine), cq, flavors, cluster_queues) if flavors else 0
        new = min(job.high, job.size + more)
        if new > job.size:
            return Resize(job.namespace, job.name, job.size, new, cohort_cause(cq, cluster_queues))
    if suspended and not admitted and mine:
        fit = max((pods_that_fit(per_pod(job, mine), cq, f, cluster_queues) for f in flavor_order(
            cluster_queues[cq])), default=0)  # fmt: skip
        new = min(job.size, fit)
        if job.low <= new < job.size:
            return Resize(job.namespace, job.name, job.size, new, eviction_cause(mine))
    return None


def plan(jobs: list[Obj], workloads: list[Obj], local_queues: list[Obj],
         cluster_queues: list[Obj]) -> list[Resize]:  # fmt: skip
    """Every resize the elastic Jobs among ``jobs`` need now. Quota taken by one resize is
    not seen by the next until Kueue admits it: one grow per ClusterQueue's cohort a round,
    and none in a cohort where a workload waits."""
    lqs = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in local_queues}
    cqs = {q["metadata"]["name"]: q for q in cluster_queues}
    out: list[Resize] = []
    busy = waiting_pools(workloads, lqs, cqs)  # shrinks only: who waits comes first
    for job in sorted(filter(None, map(elastic_job, jobs)),
                      key=lambda j: j.obj["metadata"].get("creationTimestamp") or ""):  # fmt: skip
        resize = decide(job, workloads, lqs, cqs)
        if resize is None:
            continue
        pool = _pool(str(lqs[(job.namespace, job.queue)]["spec"]["clusterQueue"]), cqs)
        if resize.new > resize.old and pool in busy:
            continue
        busy.add(pool)
        out.append(resize)
    return out


def patch(resize: Resize, job: Obj, now: dt.datetime) -> Obj:
    """The merge patch of the Job for ``resize``: parallelism and completions together (an
    elastic Indexed Job changes both or neither), and the resize appended to its history."""
    entry = {"from": resize.old, "to": resize.new, "cause": resize.cause,
             "at": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip
    history = [*resizes(job), entry][-KEPT_RESIZES:]
    return {"metadata": {"annotations": {ANNOTATION_RESIZES: json.dumps(history)}},
            "spec": {"parallelism": resize.new, "completions": resize.new}}  # fmt: skip
