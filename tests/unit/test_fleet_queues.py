"""`gpufleet queues`: quota per flavor (lendable as Kueue's lendingLimit reads), and waiting
jobs in Kueue's order (priority, then queue-order time, then UID)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from gpufleet.cluster.fleet import Fleet
from gpufleet.cluster.queues import counts, order_time, pending, quota, waiting_jobs
from gpufleet.console import camel_json

NOW = dt.datetime(2026, 11, 20, 11, 0, tzinfo=dt.UTC)


def cluster_queue(name: str, resources: list[dict[str, Any]], usage: list[dict[str, Any]],
                  **status: Any) -> dict[str, Any]:  # fmt: skip
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"cohortName": "lab", "resourceGroups": [
                {"coveredResources": [r["name"] for r in resources],
                 "flavors": [{"name": "a30", "resources": resources}]}]},
            "status": {"flavorsUsage": [{"name": "a30", "resources": usage}],
                       **status}}  # fmt: skip


def local_queue(ns: str, name: str, cq: str) -> dict[str, Any]:
    return {"kind": "LocalQueue", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterQueue": cq}, "status": {"pendingWorkloads": 1}}  # fmt: skip


def workload(
    name: str, *, ns: str = "research", queue: str = "research", priority: int = 0,
    created: str = "2026-11-20T10:00:00Z", uid: str = "u", **conditions: Any,
) -> Any:  # fmt: skip
    reserved = {"type": "QuotaReserved", "status": "False", "reason": "Pending",
                "message": f"{name} needs more GPUs", "lastTransitionTime": created}  # fmt: skip
    conds = [reserved, *({"type": t, **c} for t, c in conditions.items())]
    return {"kind": "Workload",
            "metadata": {"name": f"job-{name}", "namespace": ns, "uid": uid,
                         "creationTimestamp": created,
                         "ownerReferences": [{"kind": "Job", "name": name, "uid": f"o-{uid}"}]},
            "spec": {"queueName": queue, "priority": priority},
            "status": {"conditions": conds}}  # fmt: skip


def test_quota_rows_say_nominal_used_borrowed_and_lendable() -> None:
    cq = cluster_queue("research", [
        {"name": "nvidia.com/gpu", "nominalQuota": 8, "lendingLimit": 4},
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "256Gi", "borrowingLimit": "64Gi"},
    ], [
        {"name": "nvidia.com/gpu", "total": "10", "borrowed": "4"},  # 6 of its own in use
        {"name": "cpu", "total": "16", "borrowed": "0"},
        {"name": "memory", "total": "64Gi", "borrowed": "0"},
    ])  # fmt: skip
    rows = {r.resource: r for r in quota(cq)}
    gpu, cpu, mem = rows["nvidia.com/gpu"], rows["cpu"], rows["memory"]
    assert (gpu.nominal, gpu.used, gpu.borrowed, gpu.lendable) == ("8", "10", "4", "2")
    assert gpu.lending_limit == "4"  # 2 of its own unused, under the limit of 4
    assert (cpu.lendable, mem.lendable, mem.borrowing_limit) == ("48", "192Gi", "64Gi")
    unused = quota(cluster_queue("q", [{"name": "nvidia.com/gpu", "nominalQuota": 8,
                                        "lendingLimit": 4}], []))  # fmt: skip
    assert unused[0].lendable == "4" and unused[0].used == "0"  # the limit caps it


def test_fractional_quantities_keep_their_unit() -> None:
    cq = cluster_queue("q", [{"name": "cpu", "nominalQuota": "1500m"}],
                       [{"name": "cpu", "total": "500m", "borrowed": "0"}])  # fmt: skip
    assert quota(cq)[0].lendable == "1000m"


def test_a_remainder_steps_down_to_a_whole_number_of_a_smaller_unit() -> None:
    cq = cluster_queue("q", [{"name": "memory", "nominalQuota": "6Ti"},
                             {"name": "cpu", "nominalQuota": "2k"}],
                       [{"name": "memory", "total": "16Gi", "borrowed": "0"},
                        {"name": "cpu", "total": "1", "borrowed": "0"}])  # fmt: skip
    assert [q.lendable for q in quota(cq)] == ["6128Gi", "1999"]


def test_a_queues_counts_and_why_it_is_inactive() -> None:
    why = "Can't admit new workloads: references missing ResourceFlavor(s): a30"
    inactive = {"type": "Active", "status": "False", "reason": "FlavorNotFound", "message": why}
    cq = cluster_queue("research", [], [], pendingWorkloads=3, admittedWorkloads=1,
                       conditions=[inactive])  # fmt: skip
    got = counts(cq, local=False)
    assert (got.pending, got.admitted, got.cohort) == (3, 1, "lab")
    assert got.inactive is not None and "missing ResourceFlavor" in got.inactive
    lq = counts(local_queue("research", "research", "research"), local=True)
    assert (lq.namespace, lq.cluster_queue, lq.pending, lq.quota) == ("research", "research", 1, [])
    assert camel_json(lq)["clusterQueue"] == "research"


def test_waiting_jobs_are_in_kueues_order_priority_then_time_then_uid() -> None:
    fleet = Fleet(workloads=[
        workload("late", created="2026-11-20T10:05:00Z", uid="a"),
        workload("urgent", created="2026-11-20T10:09:00Z", priority=100, uid="b"),
        workload("early", created="2026-11-20T10:01:00Z", uid="d"),
        workload("twin", created="2026-11-20T10:01:00Z", uid="c"),  # same time: UID decides
        workload("admitted", uid="e", QuotaReserved={"status": "True"}),
        workload("finished", uid="f", Finished={"status": "True"}),
    ], local_queues=[local_queue("research", "research", "research")],
        cluster_queues=[cluster_queue("research", [], [], pendingWorkloads=4)])  # fmt: skip
    waiting = waiting_jobs(fleet, NOW)
    assert [(w.job, w.position, w.of, w.exact) for w in waiting] == [
        ("urgent", 1, 4, True), ("twin", 2, 4, True), ("early", 3, 4, True),
        ("late", 4, 4, True)]  # fmt: skip
    assert waiting[0].waited_seconds == 51 * 60 and waiting[0].reason == "urgent needs more GPUs"
    assert waiting[0].cluster_queue == "research" and waiting[0].local_queue == "research"


def test_a_workload_whose_local_queue_is_missing_has_no_position() -> None:
    (lost,) = waiting_jobs(Fleet(workloads=[workload("lost", queue="none")]), NOW)
    assert lost.position is None and lost.cluster_queue is None


def test_positions_among_the_visible_are_a_lower_bound_when_the_queue_holds_more() -> None:
    fleet = Fleet(workloads=[workload("mine")],
                  local_queues=[local_queue("research", "research", "shared")],
                  cluster_queues=[cluster_queue("shared", [], [], pendingWorkloads=5)])  # fmt: skip
    (only,) = waiting_jobs(fleet, NOW)
    assert (only.position, only.of, only.exact) == (1, 5, False)


def test_an_eviction_for_readiness_or_a_check_requeues_by_its_time() -> None:
    evicted = {"status": "True", "reason": "PodsReadyTimeout",
               "lastTransitionTime": "2026-11-20T10:30:00Z"}  # fmt: skip
    assert order_time(workload("a", Evicted=evicted)) == "2026-11-20T10:30:00Z"
    preempted = {**evicted, "reason": "Preempted"}  # keeps its place: ordered by creation
    assert order_time(workload("a", Evicted=preempted)) == "2026-11-20T10:00:00Z"


@pytest.mark.parametrize("spec, conditions, expected", [
    ({}, {}, True),
    ({"active": False}, {}, False),
    ({}, {"QuotaReserved": {"status": "True"}}, False),
])  # fmt: skip
def test_pending_means_waiting_for_quota(spec: Any, conditions: Any, expected: bool) -> None:
    wl = workload("w", **conditions)
    wl["spec"].update(spec)
    if conditions:
        wl["status"]["conditions"] = [{"type": t, **c} for t, c in conditions.items()]
    assert pending(wl) is expected


def test_the_cli_prints_quota_queues_and_the_waiting_in_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app
    from tests.support.scenarios import cli_on
    from tests.unit.test_fleet_jobs import fleet_kube

    kube = fleet_kube()
    cli_on(kube, monkeypatch)
    shown = CliRunner().invoke(app, ["queues", "-A"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), shown.stdout
    assert lines[0] == "ClusterQueue team-a: 1 pending, 2 admitted"
    assert lines[1].split() == ["FLAVOR", "RESOURCE", "NOMINAL", "USED", "BORROWED", "LENDABLE"]
    waiting = lines[lines.index("Waiting, in Kueue's order:") + 1 :]
    assert waiting[1].split()[:4] == ["-", "team-a", "no-localqueue", "-"]  # in no queue
    assert waiting[2].split()[:5] == ["1", "of", "1", "team-a", "kueue-quota"]
    data = json.loads(CliRunner().invoke(app, ["queues", "-o", "json"]).stdout)
    assert data["clusterQueues"][0]["quota"][0]["lendable"] == "48"
    kube.refuse = {"clusterqueues.kueue.x-k8s.io": 404}  # no Kueue: the LocalQueues only
    bare = CliRunner().invoke(app, ["queues"])
    assert "ClusterQueues not readable here" in bare.stderr and "LocalQueues:" in bare.stdout
