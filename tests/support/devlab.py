"""The chart installed with the 3-node A30 lab's values on the session's local control plane
(the shared `lab` fixture: tenants research and product in cohort "lab"), and the queued jobs
its tenants submit (tests/cluster/test_devcluster_queues.py, test_devcluster_tenancy.py,
test_devcluster_ray.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.chart import expected_namespaces
from tests.support.devcluster import CHART, DevCluster, start, stop
from tests.support.procs import poll_until
from tests.support.specs import cluster_job

KUEUE = ("kueue.x-k8s.io", "v1beta2")
# The 50-node on-premises design's own cluster (tests/cluster/test_devcluster_design.py).
DESIGN, DESIGN_VALUES = "design", CHART / "ci" / "onprem-50node-values.yaml"
PODS_READY_TIMEOUT_S = 15  # its Kueue's waitForPodsReady


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


@contextmanager
def lab_installed(devcluster: DevCluster) -> Iterator[DevCluster]:
    """The chart installed with the 3-node A30 lab's values (tenants research and product in
    cohort "lab"), uninstalled at the end: the shared fixture `lab` (tests/cluster/conftest.py)."""
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


def tenant_leftovers(lab: DevCluster, owners: tuple[str, ...] = ()) -> list[str]:
    """The lab tenants' Workloads and pods (only those of the jobs ``owners`` names, if any):
    name, phase, and whether they are being deleted. Until they are gone, they count in
    Kueue's usage and in the GPUs the fleet page shows each tenant holding."""
    out = []
    for ns in ("research", "product"):
        for w in lab.workloads(ns):
            owned = [o["name"] for o in w["metadata"].get("ownerReferences") or []]
            if not owners or set(owned) & set(owners):
                out.append(f"{ns}/{w['metadata']['name']} (Workload)")
        for pod in lab.core.list_namespaced_pod(ns).items:
            if owners and not pod.metadata.name.startswith(owners):
                continue
            gone = " deleting" if pod.metadata.deletion_timestamp else ""
            out.append(f"{ns}/{pod.metadata.name} {pod.status.phase}{gone}")
    return out


def queued_job(name: str, tenant: str, nodes: int, gpus: int, target: str | None = None,
               **spec: Any) -> dict[str, Any]:  # fmt: skip
    """A queued digits job of ``tenant``, its checkpoints in S3; for a TensorFlow or Ray
    target, on the volume cluster_job names (they write to a filesystem: bound_claim makes
    it)."""
    where: dict[str, Any] = {"checkpoint": {"dir": "s3://bucket/ckpt"}, "volumes": []}
    if target in ("tfjob", "rayjob"):
        where = {}
    doc = cluster_job(target=target, nodes=nodes, procsPerNode=gpus, resources={"gpu": gpus},
                      queue=tenant, **where, **spec)  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": tenant}
    return doc


def bound_claim(cluster: DevCluster, namespace: str, claim: str) -> None:
    """A PersistentVolumeClaim bound to a static PersistentVolume made for it (kwok's pods
    mount nothing; the scheduler only wants the claim bound)."""
    volume = f"{namespace}-{claim}"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                   "storageClassName": "", "hostPath": {"path": f"/tmp/{namespace}-{claim}"},
                   "claimRef": {"namespace": namespace, "name": claim}}}  # fmt: skip
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    cluster.core.create_persistent_volume(pv)
    cluster.core.create_namespaced_persistent_volume_claim(namespace, pvc)
    poll_until(lambda: cluster.core.read_namespaced_persistent_volume_claim(claim, namespace)
               .status.phase == "Bound", what=f"claim {claim} bound", timeout=60)  # fmt: skip


@contextmanager
def design_installed(root: Path) -> Iterator[DevCluster]:
    """The design's cluster (four kwok nodes of 8 GPUs per flavor, Kueue's waitForPodsReady at
    PODS_READY_TIMEOUT_S) with the chart and the same values, stopped at the end. Beside the
    session's cluster, whose MPI operator holds its fixed port (not needed here)."""
    cluster = start(root, nodes=4, gpus=8, values=DESIGN_VALUES, without=("mpi-operator",),
                    extra=("--pods-ready-timeout", f"{PODS_READY_TIMEOUT_S}s"))  # fmt: skip
    try:
        for namespace in expected_namespaces(DESIGN_VALUES):  # its Alertmanager's, its mirror's
            cluster.ensure_namespace(namespace)
        cluster.helm("install", "onprem", str(CHART), "-f", str(DESIGN_VALUES), "-n",
                     "gpufleet-system", "--create-namespace", "--wait",
                     "--timeout", "120s")  # fmt: skip
        yield cluster
    finally:
        stop(cluster)
