"""The elastic controller's decisions (gpufleet.cluster.elastic): Kueue's quota arithmetic for a
flat cohort, when a job grows, when a waiting one is set to the size that fits, and the history
a resize leaves on the Job. The same decisions on Kueue itself: tests/cluster."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest

from gpufleet.cluster.elastic import (
    Resize,
    available,
    demand,
    elastic_job,
    eviction_cause,
    patch,
    plan,
    pod_requests,
    settled,
)
from gpufleet.cluster.resizes import (
    KEPT_RESIZES,
    describe,
    node_range,
    resize_lines,
    resizes,
    size_text,
)
from gpufleet.cluster.status import summarize
from gpufleet.kube import ANNOTATION_NODE_RANGE, ANNOTATION_RESIZES, KUEUE_ELASTIC_JOB, Obj
from tests.unit.test_cluster import PREEMPTED_BY_LENDER

GPU = ("a30", "nvidia.com/gpu")


def cq(name: str, nominal: int, used: int = 0, cohort: str | None = "lab", **limits: int) -> Obj:
    """A ClusterQueue with one flavor's GPUs (limits: borrowingLimit, lendingLimit)."""
    res = {"name": GPU[1], "nominalQuota": nominal, **limits}
    spec: Obj = {
        "resourceGroups": [
            {"coveredResources": [GPU[1]], "flavors": [{"name": GPU[0], "resources": [res]}]}
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    status = {"flavorsReservation": [{"name": GPU[0], "resources": [
        {"name": GPU[1], "total": str(used), "borrowed": "0"}]}]}  # fmt: skip
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def lab(research: int, product: int) -> dict[str, Obj]:
    """The chart's lab values: research 6 (borrows 2, lends 4), product 6 (lends 2)."""
    return {"research": cq("research", 6, research, borrowingLimit=2, lendingLimit=4),
            "product": cq("product", 6, product, lendingLimit=2)}  # fmt: skip


@pytest.mark.parametrize(
    ("research", "product", "free_research", "free_product"),
    [
        (0, 0, 8, 10),  # research: 6 + its 2 to borrow; product: 6 + the 4 research lends
        (0, 6, 6, 4),  # product uses its 6: research has its own 6, product 4 more to borrow
        (8, 0, 0, 4),  # research borrows product's 2: product has its 4 guaranteed left
        (4, 4, 4, 4),
    ],
)
def test_the_free_quota_is_kueues_for_a_flat_cohort(
    research: int, product: int, free_research: int, free_product: int
) -> None:
    queues = lab(research, product)
    assert available("research", GPU, queues) == free_research
    assert available("product", GPU, queues) == free_product


def test_a_queue_outside_any_cohort_has_its_nominal_quota_less_what_it_uses() -> None:
    queues = {"solo": cq("solo", 8, 3, cohort=None), "other": cq("other", 8, 0, cohort=None)}
    assert available("solo", GPU, queues) == 3 + 2
    assert available("solo", ("other-flavor", GPU[1]), queues) == 0


def job(size: int, span: str = "1:2", *, suspend: bool = False, gpu: int = 4, **extra: Any) -> Obj:
    annotations = {KUEUE_ELASTIC_JOB: "true", ANNOTATION_NODE_RANGE: span, **extra}
    container = {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": str(gpu)}}}
    return {"metadata": {"name": "e", "namespace": "research", "uid": "u-e",
                         "creationTimestamp": "2026-12-07T03:00:00Z",
                         "labels": {"kueue.x-k8s.io/queue-name": "research"},
                         "annotations": annotations},
            "spec": {"parallelism": size, "completions": size, "suspend": suspend,
                     "template": {"spec": {"containers": [container]}}}}  # fmt: skip


def workload(name: str, *conditions: tuple[str, str], owner: str = "u-e", **status: Any) -> Obj:
    conds = [{"type": t, "status": "True", "message": m,
              "lastTransitionTime": "2026-12-07T03:10:00Z"} for t, m in conditions]  # fmt: skip
    return {"metadata": {"name": name, "namespace": "research",
                         "ownerReferences": [{"uid": owner}]},
            "status": {"conditions": conds, **status}}  # fmt: skip


ADMITTED = workload("w1", ("Admitted", ""), ("QuotaReserved", ""),
                    admission={"podSetAssignments": [{"flavors": {GPU[1]: GPU[0]}}]})  # fmt: skip
LOCAL_QUEUES = [{"metadata": {"name": "research", "namespace": "research"},
                 "spec": {"clusterQueue": "research"}}]  # fmt: skip


def decided(jobs: list[Obj], workloads: list[Obj], research: int, product: int) -> list[Resize]:
    return plan(jobs, workloads, LOCAL_QUEUES, list(lab(research, product).values()))


def test_a_running_job_grows_into_the_quota_that_freed() -> None:
    (resize,) = decided([job(1)], [ADMITTED], research=4, product=0)
    assert resize == Resize("research", "e", 1, 2, "quota freed in cohort lab")


def test_a_job_grows_no_further_than_its_range_or_the_free_quota() -> None:
    assert decided([job(1, gpu=2)], [ADMITTED], research=2, product=0)[0].new == 2  # its range
    assert decided([job(2, "1:4", gpu=2)], [ADMITTED], research=4, product=2)[0].new == 4
    assert decided([job(1, "1:4", gpu=2)], [ADMITTED], research=2, product=2)[0].new == 4
    assert decided([job(1)], [ADMITTED], research=4, product=6) == []  # 2 free: no 4-GPU pod
    assert decided([job(2)], [ADMITTED], research=8, product=0) == []  # already at spec.nodes
    cpu = job(1)
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    assert decided([cpu], [ADMITTED], research=0, product=0) == []  # no quota covers cpu


def test_no_job_grows_while_a_slice_of_it_waits_or_it_is_suspended() -> None:
    # kueue#15661: an old slice evicted while a scale-up waits lets pods run without quota
    pending_slice = workload("w2", ("QuotaReserved", ""))
    assert decided([job(1)], [ADMITTED, pending_slice], research=4, product=0) == []
    assert decided([job(1, suspend=True)], [ADMITTED], research=4, product=0) == []
    done = workload("w0", ("Finished", ""))  # the slice it replaced: not counted
    assert len(decided([job(1)], [ADMITTED, done], research=4, product=0)) == 1


def test_no_job_grows_before_its_pods_are_ready_or_in_a_topology_flavor() -> None:
    starting = workload("w1", ("Admitted", ""), admission=ADMITTED["status"]["admission"])
    starting["status"]["conditions"].append({"type": "PodsReady", "status": "False"})
    assert decided([job(1)], [starting], research=4, product=0) == []  # within its timeout
    ready = workload("w1", ("Admitted", ""), ("PodsReady", ""),
                     admission=ADMITTED["status"]["admission"])  # fmt: skip
    assert len(decided([job(1)], [ready], research=4, product=0)) == 1
    topology = {"levels": ["kubernetes.io/hostname"], "domains": [{"values": ["n0"], "count": 1}]}
    placed = {"podSetAssignments": [{"flavors": {GPU[1]: GPU[0]}, "topologyAssignment": topology}]}
    racked = workload("w1", ("Admitted", ""), ("PodsReady", ""), admission=placed)
    assert decided([job(1)], [racked], research=4, product=0) == []  # kueue 0.19.2's TAS ungater
    assert settled(ready) and not settled(racked) and not settled(starting)


def test_an_evicted_job_waits_for_readmission_at_the_size_that_fits() -> None:
    evicted = workload("w1", ("Evicted", PREEMPTED_BY_LENDER), ("Preempted", PREEMPTED_BY_LENDER))
    (resize,) = decided([job(2, suspend=True)], [evicted], research=0, product=6)
    assert resize == Resize("research", "e", 2, 1, "reclaimed by product")
    # the whole size fits, or not even minNodes: Kueue's own decision
    assert decided([job(2, suspend=True)], [evicted], research=0, product=0) == []
    assert decided([job(2, "2:2", suspend=True)], [evicted], research=0, product=6) == []
    assert decided([job(2, suspend=True)], [evicted], research=6, product=6) == []


def test_a_job_never_admitted_starts_at_the_size_that_fits() -> None:
    waiting = workload("w1", ("QuotaReserved", "")) | {"status": {"conditions": []}}
    (resize,) = decided([job(2, suspend=True)], [waiting], research=2, product=6)
    assert (resize.new, resize.cause) == (1, "admitted at the size that fits")


def waiting(namespace: str, queue: str, pods: int, gpu: int) -> Obj:
    """Another job's Workload, waiting for quota in ``queue``."""
    template = {"spec": {"containers": [{"name": "w", "resources": {
        "requests": {"nvidia.com/gpu": str(gpu)}}}]}}  # fmt: skip
    return {"metadata": {"name": f"other-{pods}x{gpu}", "namespace": namespace,
                         "ownerReferences": [{"uid": "u-other"}]},
            "spec": {"queueName": queue, "podSets": [{"name": "main", "count": pods,
                                                      "template": template}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False"}]}}  # fmt: skip


def test_no_job_grows_while_a_workload_its_cohort_could_admit_waits() -> None:
    product_queue = [{"metadata": {"name": "product", "namespace": "product"},
                      "spec": {"clusterQueue": "product"}}]  # fmt: skip
    queues = LOCAL_QUEUES + product_queue

    def grows(other: Obj, **research_queue: int) -> bool:
        cqs = list(lab(0, 6).values())
        if research_queue:  # research alone, outside the cohort
            cqs = [cq("research", 8, 0, cohort=None), cq("product", 6, 6)]
        return bool(plan([job(1)], [ADMITTED, other], queues, cqs))

    assert not grows(waiting("product", "product", 2, 4))  # product waits for 8: it comes first
    assert not grows(waiting("research", "research", 1, 2))
    assert grows(waiting("product", "product", 3, 4))  # 12 > product's 6 + the 4 it may borrow
    assert grows(waiting("product", "product", 1, 4), alone=1)  # another cohort's wait
    assert grows(waiting("product", "nowhere", 1, 4))  # no LocalQueue: Kueue holds it inactive
    inactive = waiting("product", "product", 1, 4) | {"spec": {"active": False}}
    assert grows(inactive)
    assert demand(waiting("product", "product", 3, 4)) == {"pods": 3, "nvidia.com/gpu": 12}


def test_one_grow_per_cohort_a_round_and_only_elastic_unfinished_jobs() -> None:
    second = job(1) | {"metadata": {**job(1)["metadata"], "name": "f", "uid": "u-f",
                                    "creationTimestamp": "2026-12-07T03:05:00Z"}}  # fmt: skip
    admitted_f = workload("wf", ("Admitted", ""), owner="u-f",
                          admission=ADMITTED["status"]["admission"])  # fmt: skip
    (only,) = decided([second, job(1)], [ADMITTED, admitted_f], research=0, product=0)
    assert only.name == "e"  # the older job first; the other waits for the next round
    plain = job(1)
    del plain["metadata"]["annotations"][KUEUE_ELASTIC_JOB]
    finished = job(1) | {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    broken = job(1, span="2:1")
    assert decided([plain, finished, broken], [ADMITTED], research=0, product=0) == []


def test_the_eviction_names_who_took_the_quota_back() -> None:
    preempted = PREEMPTED_BY_LENDER.replace("reclamation within the cohort", "prioritization")
    assert eviction_cause([workload("w", ("Preempted", preempted))]) == "preempted by product"
    assert eviction_cause([workload("w", ("Evicted", "x"))]) == "evicted (by Kueue)"


def test_a_resize_patches_the_size_and_keeps_its_history() -> None:
    now = dt.datetime(2026, 12, 7, 3, 12, 5, tzinfo=dt.UTC)
    body = patch(Resize("research", "e", 1, 2, "quota freed in cohort lab"), job(1), now)
    assert body["spec"] == {"parallelism": 2, "completions": 2}
    history = json.loads(body["metadata"]["annotations"][ANNOTATION_RESIZES])
    assert history == [{"from": 1, "to": 2, "cause": "quota freed in cohort lab",
                        "at": "2026-12-07T03:12:05Z"}]  # fmt: skip
    assert describe(history[0]) == "grew 1→2 at 03:12:05Z (quota freed in cohort lab)"
    full = job(2, **{ANNOTATION_RESIZES: json.dumps([history[0]] * KEPT_RESIZES)})
    again = patch(Resize("research", "e", 2, 1, "reclaimed by product"), full, now)
    kept = json.loads(again["metadata"]["annotations"][ANNOTATION_RESIZES])
    assert len(kept) == KEPT_RESIZES and describe(kept[-1]).startswith("shrank 2→1 at 03:12:05Z")
    assert resizes(job(1, **{ANNOTATION_RESIZES: "not json"})) == []
    assert size_text(full) == "2 of 1–2 nodes" and resize_lines(full)[-1] == describe(history[0])


def test_status_shows_the_size_in_its_range_and_the_resizes() -> None:
    history = [
        {"from": 1, "to": 2, "cause": "quota freed in cohort lab", "at": "T03:12:05Z"},
        {"from": 2, "to": 1, "cause": "reclaimed by product", "at": "T03:20:00Z"},
    ]
    shrunk = job(1, **{ANNOTATION_RESIZES: json.dumps(history)}) | {"kind": "Job"}
    status = summarize(shrunk, [])
    assert status.size == "1 of 1–2 nodes"
    assert status.resizes == ["grew 1→2 at 03:12:05Z (quota freed in cohort lab)",
                              "shrank 2→1 at 03:20:00Z (reclaimed by product)"]  # fmt: skip
    assert "; size 1 of 1–2 nodes; shrank 2→1 at 03:20:00Z (reclaimed by product)" in (
        status.line()
    )
    assert status.as_dict()["resizes"] == status.resizes
    plain = job(1)
    del plain["metadata"]["annotations"][ANNOTATION_NODE_RANGE]
    assert summarize(plain, []).size is None and "size" not in summarize(plain, []).line()


def test_what_kueue_counts_for_a_pod_and_the_node_range() -> None:
    assert pod_requests(job(1)["spec"]["template"]) == {"pods": 1, "nvidia.com/gpu": 4}
    assert pod_requests({"spec": {"containers": [{"resources": {"requests": {
        "memory": "1Gi"}}}] * 2}})["memory"] == Decimal(2 * 2**30)  # fmt: skip
    assert [node_range(t) for t in ("1:2", "3:3", "2:1", "0:2", "x")] == [
        (1, 2), (3, 3), None, None, None]  # fmt: skip
    assert elastic_job(job(1)) is not None


def solo(gpu: tuple[int, int], cpu: tuple[int, int]) -> Obj:
    """A ClusterQueue outside any cohort covering GPUs and CPUs: (nominal, used) of each."""
    pairs = list(zip((GPU[1], "cpu"), (gpu, cpu), strict=True))
    resources = [{"name": n, "nominalQuota": q[0]} for n, q in pairs]
    group = {"coveredResources": [n for n, _ in pairs],
             "flavors": [{"name": GPU[0], "resources": resources}]}  # fmt: skip
    used = [{"name": n, "total": str(q[1])} for n, q in pairs]
    return {"metadata": {"name": "research"}, "spec": {"resourceGroups": [group]},
            "status": {"flavorsReservation": [{"name": GPU[0], "resources": used}]}}  # fmt: skip


def test_a_pod_counts_what_kueue_counts_the_limitranges_defaults_included() -> None:
    """The namespace's LimitRange gives each pod a CPU its spec does not ask for: Kueue counts
    it (its admission's resourceUsage; status.resourceRequests while it waits), and so does
    the controller, which would grow the job past the free CPUs otherwise."""
    flavors = {GPU[1]: GPU[0], "cpu": GPU[0]}
    usage = {"flavors": flavors, "count": 1, "resourceUsage": {GPU[1]: "2", "cpu": "1"}}
    admitted = workload("w1", ("Admitted", ""), admission={"podSetAssignments": [usage]})
    grown = plan([job(1, "1:4", gpu=2)], [admitted], LOCAL_QUEUES, [solo((8, 2), (2, 1))])
    assert [r.new for r in grown] == [2]  # one CPU free; its template alone would grow it to 4
    asked = {"resources": {GPU[1]: "4", "cpu": "2", "pods": "2"}, "name": "main"}
    evicted = workload("w1", ("Evicted", PREEMPTED_BY_LENDER), resourceRequests=[asked])
    evicted["spec"] = {"podSets": [{"name": "main", "count": 2}]}
    shrunk = plan([job(2, gpu=2, suspend=True)], [evicted], LOCAL_QUEUES, [solo((8, 0), (1, 0))])
    assert [(r.old, r.new) for r in shrunk] == [(2, 1)]  # 2 pods by GPUs, 1 by CPUs
    assert demand(evicted) == {GPU[1]: 4, "cpu": 2, "pods": 2}
    assert demand(admitted | {"spec": {"podSets": [{"name": "main", "count": 3}]}}) == {
        GPU[1]: 2, "cpu": 1, "pods": 1}  # the admission's count, not the spec's  # fmt: skip
