"""Ray on the local control plane (issue 30, item 2): a RayJob that gpufleet renders is admitted
by Kueue (its ray.io/rayjob integration, which `cluster up` turns on when KubeRay runs), and the
real KubeRay operator makes its RayCluster: a head and a fixed worker group whose pods the
research namespace's Pod Security "restricted" admits, GPU requests on the workers only.
Cancel leaves nothing. kwok's pods run no Ray, so the job itself never starts here (real nodes
do that)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.devcluster import DevCluster, condition, needs_controlplane, workload_of
from tests.support.devlab import bound_claim, queued_job
from tests.support.procs import poll_until
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
RAY = ("ray.io", "v1")


def ray_clusters(cluster: DevCluster, ns: str, job: str) -> list[dict[str, Any]]:
    listed = cluster.custom.list_namespaced_custom_object(*RAY, ns, "rayclusters")
    return [c for c in listed["items"]
            if any(o["name"] == job for o in c["metadata"].get("ownerReferences", []))]  # fmt: skip


def test_a_queued_rayjob_is_admitted_and_kuberay_makes_its_restricted_cluster(
    lab: DevCluster,
) -> None:
    name, ns = "queued-ray", "research"
    doc = queued_job(name, ns, nodes=2, gpus=2, target="rayjob")
    claim = doc["spec"]["volumes"][0]["claimName"]
    bound_claim(lab, ns, claim)
    try:
        path = write_spec(lab.root, doc, f"{name}.yaml")
        submit = lab.gpufleet("submit", str(path), "--target", "rayjob")
        assert submit.returncode == 0, submit.stderr[-2000:]
        poll_until(lambda: condition(workload_of(lab, ns, name), "Admitted"),
                   what="the RayJob's Workload admitted", timeout=60)  # fmt: skip
        wl = workload_of(lab, ns, name)
        assert wl is not None and wl["status"]["admission"]["clusterQueue"] == "research"
        poll_until(lambda: len(lab.pods(ns, name)) == 3, what="a head and two workers",
                   timeout=90, interval=0.5)  # fmt: skip
        (ray_cluster,) = ray_clusters(lab, ns, name)
        (group,) = ray_cluster["spec"]["workerGroupSpecs"]
        assert group["replicas"] == 2 and group["rayStartParams"]["num-gpus"] == "2"
        by_type: dict[str, list[dict[str, Any]]] = {}
        for pod in lab.pods(ns, name):
            by_type.setdefault(pod["metadata"]["labels"].get("ray.io/node-type"), []).append(pod)
        (head_pod,), workers = by_type["head"], by_type["worker"]
        assert len(workers) == 2, by_type
        for worker in workers:
            container = worker["spec"]["containers"][0]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
            assert worker["spec"]["nodeName"].startswith("gpu-node-")
            # KubeRay's own parts: its ray start command, its wait for the head's GCS
            assert "ray start" in " ".join(container["command"] + container.get("args", []))
            assert [c["name"] for c in worker["spec"]["initContainers"]] == ["wait-gcs-ready"]
        head = head_pod["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in (head.get("resources") or {}).get("limits", {})
        status = lab.gpufleet("status", name, "-n", ns)
        assert status.returncode == 0 and "RayJob" in status.stdout, status.stdout
        cancel = lab.gpufleet("cancel", name, "-n", ns)
        assert cancel.returncode == 0, cancel.stderr[-2000:]
        poll_until(lambda: not lab.pods(ns, name) and workload_of(lab, ns, name) is None
                   and not ray_clusters(lab, ns, name),
                   what="no pod, workload or RayCluster of the job", timeout=90,
                   interval=0.5)  # fmt: skip
    finally:
        lab.core.delete_namespaced_persistent_volume_claim(claim, ns)
        lab.core.delete_persistent_volume(f"{ns}-{claim}")
