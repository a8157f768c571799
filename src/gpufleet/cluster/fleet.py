"""Every gpufleet job the caller may read, in one namespace or in all: one list per kind, never
one read per job (``gpufleet jobs``, ``gpufleet queues``, the dashboard).

``read_fleet`` fetches a ``Fleet``: the jobs of every kind gpufleet renders (top-level objects
only: a JobSet's child Jobs, a TrainJob's JobSet and an MPIJob's launcher carry the same labels
but belong to their owner), their pods, Kueue's Workloads, LocalQueues and ClusterQueues, the
Warning events and Volcano's PodGroups. ``status_of`` folds one job's share of it into the
JobStatus ``gpufleet status`` prints; ``Cluster.status`` uses it too, so both say the same.
A kind whose CRD is not installed is skipped; ClusterQueues a user may not read are None.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpufleet.cluster.access import as_dict, items
from gpufleet.cluster.apierrors import api_errors, status_code, to_cluster_error
from gpufleet.cluster.kinds import (
    CLUSTER_QUEUES,
    JOB_KINDS,
    LOCAL_QUEUES,
    PODGROUPS,
    WORKLOADS,
    Kind,
)
from gpufleet.cluster.replaced import replaced_note, split_replaced
from gpufleet.cluster.status import FAILED_CREATE_REASONS, JobStatus, PodState, summarize
from gpufleet.kube import LABEL_JOB, Obj


def ns_name(obj: Obj) -> tuple[str, str]:
    """An object's (namespace, name)."""
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _top_level(obj: Obj) -> bool:
    """Not made by a controller (a JobSet's Jobs, a TrainJob's JobSet, an MPIJob's launcher)."""
    return not any(r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


@dataclass
class Fleet:
    """What the API server returned, one list per kind: the input of every fleet view."""

    jobs: list[tuple[Kind, Obj]] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    workloads: list[Obj] = field(default_factory=list)
    local_queues: list[Obj] = field(default_factory=list)
    cluster_queues: list[Obj] | None = None  # None: the caller may not list them (or no Kueue)
    events: list[Obj] = field(default_factory=list)  # Warning events only
    podgroups: list[Obj] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.index()

    def index(self) -> None:
        """Look-ups by job, owner and queue (call again after changing the lists)."""
        self._pods: dict[tuple[str, str], list[Obj]] = defaultdict(list)
        for pod in sorted(self.pods, key=lambda p: p["metadata"]["name"]):
            ns, _ = ns_name(pod)
            job = (pod["metadata"].get("labels") or {}).get(LABEL_JOB)
            if job:
                self._pods[(ns, job)].append(pod)
        self._owned: dict[str, Obj] = {}
        for obj in [*self.workloads, *self.podgroups]:
            for ref in obj["metadata"].get("ownerReferences") or []:
                self._owned.setdefault(f"{obj['kind']}/{ref.get('uid')}", obj)
        self._local = {ns_name(q): q for q in self.local_queues}
        self._cluster = {q["metadata"]["name"]: q for q in self.cluster_queues or []}

    def pods_of(self, job: Obj) -> list[Obj]:
        """The job's pods (label gpufleet.dev/job), sorted by name."""
        return list(self._pods.get(ns_name(job), []))

    def owned(self, kind: Kind, owner: Obj) -> Obj | None:
        """The Workload (or PodGroup) that ``owner`` owns."""
        return self._owned.get(f"{kind.kind}/{owner['metadata'].get('uid')}")

    def local_queue(self, namespace: str, name: str) -> Obj | None:
        return self._local.get((namespace, name))

    def cluster_queue(self, name: str | None) -> Obj | None:
        return self._cluster.get(name or "")

    def events_of(self, job: Obj, pods: list[Obj]) -> list[Obj]:
        """The scheduler's events of the job's Pending pods, then its controllers' refusals
        (about the job, or a child named after it: a JobSet's Jobs)."""
        ns, name = ns_name(job)
        pending = {p["metadata"]["name"] for p in pods
                   if (p.get("status") or {}).get("phase") == "Pending"}  # fmt: skip
        mine = [e for e in self.events if (e.get("metadata") or {}).get("namespace", "") == ns]
        about = [(e, str((e.get("involvedObject") or {}).get("name", ""))) for e in mine]
        return [e for e, o in about if (e.get("involvedObject") or {}).get("kind") == "Pod"
                and o in pending] + [
            e for e, o in about if e.get("reason") in FAILED_CREATE_REASONS
            and self._job_named(ns, o) == name]  # fmt: skip

    def _job_named(self, namespace: str, child: str) -> str | None:
        """The job an object named ``child`` belongs to: the job of that name, else the one
        with the longest name that ``child`` starts with (job "a" is not "a-b"'s owner)."""
        names = [j["metadata"]["name"] for _, j in self.jobs
                 if j["metadata"].get("namespace", "") == namespace]  # fmt: skip
        owners = [n for n in names if child == n or child.startswith(f"{n}-")]
        return max(owners, key=len, default=None)


def status_of(fleet: Fleet, kind: Kind, job: Obj) -> JobStatus:
    """One job's status from the fleet's objects: what ``gpufleet status`` says of it."""
    pods, replaced = split_replaced(fleet.pods_of(job))
    ns = job["metadata"].get("namespace", "")
    workload = fleet.owned(WORKLOADS, job)
    local_queue = cluster_queue = None
    if workload is not None:
        local_queue = fleet.local_queue(ns, (workload.get("spec") or {}).get("queueName", ""))
        cluster_queue = fleet.cluster_queue(((local_queue or {}).get("spec") or {}).get(
            "clusterQueue"))  # fmt: skip
    podgroup = fleet.owned(PODGROUPS, job) if kind.group == "batch.volcano.sh" else None
    return fold_status(job, pods, replaced, fleet.events_of(job, pods), workload=workload,
                       local_queue=local_queue, cluster_queue=cluster_queue,
                       podgroup=podgroup)  # fmt: skip


def fold_status(
    job: Obj, pods: list[Obj], replaced: list[Obj], events: list[Obj], **queues: Obj | None
) -> JobStatus:
    """``summarize`` (``queues``: its workload, local_queue, cluster_queue and podgroup) of the
    job's current pods, with the pods its controller replaced noted and listed after them."""
    status = summarize(job, pods, events, **queues)
    note = replaced_note(replaced)
    if note:
        status.reasons.append(note)
    status.pod_states += sorted((PodState.of(p) for p in replaced), key=lambda s: s.name)
    return status


class FleetReader:
    """Lists for ``read_fleet``: in ``namespace``, or in all namespaces when it is None."""

    def __init__(self, custom: Any, core: Any, namespace: str | None) -> None:
        self.custom, self.core, self.namespace = custom, core, namespace

    def custom_objects(self, kind: Kind, **selectors: str) -> list[Obj] | None:
        """``kind``'s objects (None when its CRD is not installed, or the caller may not list a
        cluster-scoped kind)."""
        try:
            if kind is CLUSTER_QUEUES or self.namespace is None:
                found = self.custom.list_cluster_custom_object(
                    kind.group, kind.version, kind.plural, **selectors)  # fmt: skip
            else:
                found = self.custom.list_namespaced_custom_object(
                    kind.group, kind.version, self.namespace, kind.plural, **selectors)  # fmt: skip
        except api_errors() as exc:
            if status_code(exc) == 404 or (kind is CLUSTER_QUEUES and status_code(exc) == 403):
                return None
            self._across(exc)
            raise to_cluster_error(exc, f"list {kind.plural}.{kind.group}") from exc
        return [as_dict(o) for o in items(found)]

    def _across(self, exc: Exception) -> None:
        """AcrossForbidden for a refused list of every namespace (read_visible falls back)."""
        if self.namespace is None and status_code(exc) == 403:
            raise AcrossForbidden(str(exc)) from exc

    def core_objects(self, what: str, api: Any = None, **selectors: str) -> list[Obj]:
        """A built-in kind's objects (``what``: its noun in the typed API's method names, as
        ``pod``, ``event``, ``deployment``; ``api``: that API, CoreV1Api's by default)."""
        api = api if api is not None else self.core
        try:
            if self.namespace is None:
                found = getattr(api, f"list_{what}_for_all_namespaces")(**selectors)
            else:
                found = getattr(api, f"list_namespaced_{what}")(self.namespace, **selectors)
        except api_errors() as exc:
            self._across(exc)
            raise to_cluster_error(exc, f"list {what}s") from exc
        return [as_dict(o) for o in items(found)]


def read_fleet(custom: Any, core: Any, namespace: str | None, *, jobs: bool = True) -> Fleet:
    """Every gpufleet job in ``namespace`` (None: all namespaces) and what its status needs:
    about a dozen lists, however many jobs there are; without ``jobs``, only Kueue's queues and
    Workloads. ClusterError when one is refused."""
    reader = FleetReader(custom, core, namespace)
    found = [(kind, obj) for kind in (JOB_KINDS if jobs else [])
             for obj in reader.custom_objects(kind, label_selector=LABEL_JOB) or []
             if _top_level(obj)]  # fmt: skip
    volcano = any(kind.group == "batch.volcano.sh" for kind, _ in found)
    return Fleet(
        jobs=sorted(found, key=lambda kj: ns_name(kj[1])),
        pods=reader.core_objects("pod", label_selector=LABEL_JOB) if jobs else [],
        workloads=reader.custom_objects(WORKLOADS) or [],
        local_queues=reader.custom_objects(LOCAL_QUEUES) or [],
        cluster_queues=reader.custom_objects(CLUSTER_QUEUES),
        events=reader.core_objects("event", field_selector="type=Warning") if jobs else [],
        podgroups=(reader.custom_objects(PODGROUPS) or []) if volcano else [],
    )


class AcrossForbidden(Exception):
    """A list across all namespaces was refused (403): the caller may read some only."""


def read_visible(
    custom: Any, core: Any, namespace: str, *, all_namespaces: bool, jobs: bool = True
) -> tuple[Fleet, str | None]:
    """``read_fleet`` of every namespace when asked and allowed, else of ``namespace``; with
    a note when all were asked for but the caller may not list across them (a tenant's user)."""
    if all_namespaces:
        try:
            return read_fleet(custom, core, None, jobs=jobs), None
        except AcrossForbidden:
            note = (f"you may not list across namespaces (forbidden): namespace {namespace} "
                    "only")  # fmt: skip
            return read_fleet(custom, core, namespace, jobs=jobs), note
    return read_fleet(custom, core, namespace, jobs=jobs), None
