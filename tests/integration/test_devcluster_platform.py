"""The platform on the real controllers (issue 11, items 3a-3d): the chart installed with every
ci/ values file and accepted by Kueue, queued jobs admitted by Kueue and run by the Job and JobSet
controllers on kwok's GPU nodes, gangs that wait for quota, and cohort borrowing with preemption.

All on the session's local cluster (tests/devcluster.py: 3 nodes x 4 A30, the chart's lab).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.cluster import RUN_FOR_A_DAY, exit_with
from gpufleet.kube import Obj
from tests.conftest import cluster_job, poll_until, write_spec
from tests.devcluster import CHART, DevCluster, needs_controlplane

pytestmark = [pytest.mark.slow, needs_controlplane]
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def values_of(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def active(obj: dict[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)


def release_objects(cluster: DevCluster, release: str) -> list[str]:
    """Every object the chart's labels tie to ``release`` that is still in the API (cluster-
    scoped kinds and the tenants' namespaced kinds)."""
    selector = f"app.kubernetes.io/instance={release}"
    found = []
    for plural in ("resourceflavors", "clusterqueues", "workloadpriorityclasses", "topologies"):
        listed = cluster.custom.list_cluster_custom_object(*KUEUE, plural, label_selector=selector)
        found += [f"{plural}/{o['metadata']['name']}" for o in listed["items"]]
    listed = cluster.custom.list_cluster_custom_object(*KUEUE, "localqueues",
                                                       label_selector=selector)  # fmt: skip
    found += [f"localqueues/{o['metadata']['name']}" for o in listed["items"]]
    for n in cluster.core.list_namespace(label_selector=selector).items:
        found.append(f"namespaces/{n.metadata.name}")
    rbac, storage = cluster.typed("RbacAuthorizationV1Api"), cluster.typed("StorageV1Api")
    for kind, listed in (
        ("clusterroles", rbac.list_cluster_role(label_selector=selector)),
        ("clusterrolebindings", rbac.list_cluster_role_binding(label_selector=selector)),
        ("storageclasses", storage.list_storage_class(label_selector=selector)),
    ):
        found += [f"{kind}/{o.metadata.name}" for o in listed.items]
    return found


def namespaces(cluster: DevCluster, *names: str) -> list[str]:
    """Those of ``names`` that still exist (a Terminating namespace still does)."""
    return [n.metadata.name for n in cluster.core.list_namespace().items
            if n.metadata.name in names]  # fmt: skip


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))
def test_chart_installs_is_accepted_by_kueue_and_uninstalls_clean(
    devcluster: DevCluster, values: Path
) -> None:
    release, ns = "gf-ci", "gpufleet-ci"
    devcluster.helm("install", release, str(CHART), "-f", str(values), "-n", ns,
                    "--create-namespace", "--wait", "--timeout", "120s")  # fmt: skip
    try:
        tenants = [t["name"] for t in values_of(values)["tenants"]]

        def queues_active() -> bool:
            cqs = devcluster.custom.list_cluster_custom_object(
                *KUEUE, "clusterqueues", label_selector=f"app.kubernetes.io/instance={release}"
            )["items"]
            ours = {q["metadata"]["name"]: active(q) for q in cqs}
            lqs = [devcluster.custom.get_namespaced_custom_object(*KUEUE, t, "localqueues", t)
                   for t in tenants]  # fmt: skip
            return len(ours) == len(tenants) and all(ours.values()) and all(map(active, lqs))

        poll_until(queues_active, what="every ClusterQueue and LocalQueue Active", timeout=60)
        for tenant in tenants:
            labels = devcluster.core.read_namespace(tenant).metadata.labels
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    finally:
        devcluster.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s")
    devcluster.core.delete_namespace(ns)
    poll_until(lambda: not release_objects(devcluster, release) and not namespaces(devcluster, ns),
               timeout=120, interval=1,
               what="every object of the release (namespaces included) to be gone")  # fmt: skip


def test_contradictory_values_are_refused_before_anything_is_applied(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    values = values_of(CHART / "ci" / "lab-3node-a30-values.yaml")
    values["tenants"][0]["queue"]["flavors"][0]["name"] = "h100"  # no such flavor
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(yaml.safe_dump(values))
    proc = devcluster.helm("install", "gf-bad", str(CHART), "-f", str(bad), "-n", "gf-bad",
                           check=False)  # fmt: skip
    assert proc.returncode != 0
    assert 'tenants[0].queue.flavors[0].name: flavor "h100" is not defined' in proc.stderr
    assert not release_objects(devcluster, "gf-bad")
    assert not namespaces(devcluster, "gf-bad", *(t["name"] for t in values["tenants"]))


# -- queued jobs on the lab's queues ----------------------------------------------------------


@pytest.fixture(scope="module")
def lab(devcluster: DevCluster) -> Iterator[DevCluster]:
    """The chart installed with the 3-node A30 lab's values (tenants research and product in
    cohort "lab"), uninstalled after this module."""
    values = CHART / "ci" / "lab-3node-a30-values.yaml"
    devcluster.helm("install", "lab", str(CHART), "-f", str(values), "-n", "gpufleet-system",
                    "--create-namespace", "--wait", "--timeout", "120s")  # fmt: skip
    try:
        poll_until(
            lambda: all(active(devcluster.custom.get_cluster_custom_object(
                *KUEUE, "clusterqueues", t)) for t in ("research", "product")),
            what="the lab's ClusterQueues Active", timeout=60,
        )  # fmt: skip
        yield devcluster
    finally:
        devcluster.helm("uninstall", "lab", "-n", "gpufleet-system", "--wait")
        devcluster.core.delete_namespace("gpufleet-system")
        poll_until(lambda: not release_objects(devcluster, "lab")
                   and not namespaces(devcluster, "gpufleet-system"),
                   timeout=120, interval=1, what="the lab release to be gone")  # fmt: skip


def queued_job(name: str, tenant: str, nodes: int, gpus: int, **spec: Any) -> dict[str, Any]:
    doc = cluster_job(nodes=nodes, procsPerNode=gpus, resources={"gpu": gpus}, queue=tenant,
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[], **spec)  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": tenant}
    return doc


def pod_templates(obj: Obj) -> Iterator[Obj]:
    """Every pod template inside a rendered object (Job, JobSet, ...)."""
    if isinstance(obj, dict):
        template = obj.get("template")
        if isinstance(template, dict) and "containers" in template.get("spec", {}):
            yield template
        for value in obj.values():
            yield from pod_templates(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from pod_templates(value)


def submit_annotated(cluster: DevCluster, doc: dict[str, Any], target: str,
                     annotations: dict[str, str]) -> None:  # fmt: skip
    """Render ``doc`` for ``target``, put ``annotations`` on its pods (kwok Stages) and create
    it as `gpufleet submit` does."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    objects = render(validate_training_job(doc), target)
    for obj in objects:
        for template in pod_templates(obj):
            meta = template.setdefault("metadata", {})
            meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    Cluster(cluster.custom, cluster.core, doc["metadata"]["namespace"]).submit(objects)


def workload_of(cluster: DevCluster, ns: str, job: str) -> dict[str, Any] | None:
    for wl in cluster.workloads(ns):
        owners = wl["metadata"].get("ownerReferences", [])
        if any(o["name"] == job for o in owners):
            return wl
    return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return dict(c)
    return None


@pytest.mark.parametrize("target", ["job", "jobset"])
def test_a_queued_job_is_admitted_run_and_cancelled_clean(lab: DevCluster, target: str) -> None:
    name, ns = f"queued-{target}", "research"
    doc = queued_job(name, ns, nodes=2, gpus=2)
    path = write_spec(lab.root, doc, f"{name}.yaml")
    submit = lab.gpufleet("submit", str(path), "--target", target)
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert lab.wait_phase(name, ns, "Succeeded", "Failed") == "Succeeded"
    wl = workload_of(lab, ns, name)
    assert condition(wl, "Admitted"), wl
    assert wl is not None and wl["status"]["admission"]["clusterQueue"] == "research"
    pods = lab.pods(ns, name)
    assert len(pods) == 2
    indexes, endpoints, hosts = set(), set(), {}
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert pod["status"]["phase"] == "Succeeded"
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        indexes.add(index)
        args = container["command"]
        assert "--nnodes=2" in args and "--nproc-per-node=2" in args
        endpoints |= {a.split("=", 1)[1] for a in args if a.startswith("--rdzv-endpoint=")}
        hosts[index] = f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}"
    assert indexes == {"0", "1"}
    # Every pod meets at index 0's stable name (hostname.subdomain), on the rendezvous port.
    (endpoint,) = endpoints
    assert endpoint.rsplit(":", 1)[0] == hosts["0"], (endpoint, hosts)
    cancel = lab.gpufleet("cancel", name, "-n", ns)
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    poll_until(
        lambda: not lab.pods(ns, name) and workload_of(lab, ns, name) is None
        and not [s for s in lab.core.list_namespaced_service(ns).items
                 if s.metadata.name == name],
        what="no pod, workload or service of the job", timeout=60, interval=0.5,
    )  # fmt: skip


def test_a_gang_larger_than_the_free_quota_waits_with_no_pod_then_runs(lab: DevCluster) -> None:
    """research may use 8 GPUs (6 nominal + 2 borrowed). With 4 held by a running job, a 2 x 3
    GPU job waits, all or nothing (no pod at all), status says Kueue's reason in one line; it
    is admitted once the first job is cancelled."""
    ns = "research"
    holder = queued_job("holder", ns, nodes=1, gpus=4)
    submit_annotated(lab, holder, "job", RUN_FOR_A_DAY)  # Running until cancelled
    poll_until(lambda: lab.phase("holder", ns) == "Running", what="holder Running", timeout=60)
    gang = queued_job("gang", ns, nodes=2, gpus=3)
    submit_annotated(lab, gang, "jobset", exit_with(0, after_ms=200))
    poll_until(lambda: workload_of(lab, ns, "gang"), what="the gang's Workload", timeout=30)
    time.sleep(3)  # Kueue has had its chance to (wrongly) admit it
    wl = workload_of(lab, ns, "gang")
    assert not condition(wl, "QuotaReserved") and not lab.pods(ns, "gang")
    status = lab.gpufleet("status", "gang", "-n", ns)
    line = next((x for x in status.stdout.splitlines() if "nvidia.com/gpu" in x), "")
    assert "research" in line and "a30" in line, status.stdout + status.stderr
    assert re.search(r"insufficient|exceed|quota", line, re.I), line
    assert lab.gpufleet("cancel", "holder", "-n", ns).returncode == 0
    assert lab.wait_phase("gang", ns, "Succeeded", "Failed", timeout=120) == "Succeeded"
    assert lab.gpufleet("cancel", "gang", "-n", ns).returncode == 0


def test_a_borrower_is_preempted_when_the_lender_reclaims(lab: DevCluster) -> None:
    """research borrows product's idle GPUs (8 of its 8 = 6 nominal + 2 borrowed); when product
    submits a job needing its own GPUs back, Kueue preempts research's job (reclaimWithinCohort),
    its pods end, it is requeued, and it completes once product's job is done."""
    borrower = queued_job("borrower", "research", nodes=2, gpus=4)
    submit_annotated(lab, borrower, "jobset", exit_with(0, after_ms=15000))
    poll_until(lambda: lab.phase("borrower", "research") == "Running", what="borrower Running",
               timeout=60)  # fmt: skip
    lender = queued_job("lender", "product", nodes=2, gpus=3)
    submit_annotated(lab, lender, "job", {**exit_with(0, after_ms=3000)})
    poll_until(lambda: condition(workload_of(lab, "research", "borrower"), "Evicted")
               or condition(workload_of(lab, "research", "borrower"), "Preempted"),
               what="the borrower to be preempted", timeout=60)  # fmt: skip
    status = lab.gpufleet("status", "borrower", "-n", "research")
    assert "preempted (InCohortReclamation) by a workload of ClusterQueue product" in (
        status.stdout
    ), status.stdout + status.stderr
    assert lab.wait_phase("lender", "product", "Succeeded", "Failed", timeout=120) == "Succeeded"
    assert lab.wait_phase("borrower", "research", "Succeeded", "Failed", timeout=120) == (
        "Succeeded"
    )
    for name, ns in (("lender", "product"), ("borrower", "research")):
        assert lab.gpufleet("cancel", name, "-n", ns).returncode == 0
