"""Target ``volcano`` on the real Volcano v1.10.0 (admission webhooks, controllers, scheduler)
of the session's local cluster (issue 11, items 3b, 3c and the Volcano audit): gangs scheduled
whole by vc-scheduler on kwok's GPU nodes, no NetworkPolicy of the svc plugin's, and
``maxRestarts: 0`` kept as "no retry" through Volcano's webhook."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.devcluster.kwok import NOT_KWOK_COMPLETE, exit_with
from tests.support.devcluster import DevCluster, needs_controlplane
from tests.support.procs import poll_until
from tests.support.specs import cluster_job, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
VOLCANO_JOBS = ("batch.volcano.sh", "v1alpha1")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def gang(name: str, ns: str, nodes: int, gpus: int, **spec: Any) -> dict[str, Any]:
    doc = cluster_job(nodes=nodes, procsPerNode=gpus, resources={"gpu": gpus},
                      checkpoint={"dir": "s3://bucket/ckpt"}, volumes=[], **spec)  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": ns}
    return doc


def stored(cluster: DevCluster, ns: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        *VOLCANO_JOBS, ns, "jobs", name
    )
    return job


def cancel_clean(cluster: DevCluster, ns: str, name: str) -> None:
    assert cluster.cancel(name, ns)

    def left() -> list[str]:
        groups = cluster.custom.list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", ns, "podgroups"
        )["items"]
        return [p["metadata"]["name"] for p in cluster.pods(ns, name)] + [
            g["metadata"]["name"] for g in groups
        ]

    poll_until(lambda: not left(), what="no pod or PodGroup of the job", timeout=60, interval=0.5)


def test_a_volcano_gang_runs_whole_on_gpu_nodes_under_restricted_without_network_policy(
    devcluster: DevCluster,
) -> None:
    """vc-scheduler binds both workers (schedulerName volcano) to GPU nodes, in a namespace
    enforcing `restricted` (Volcano's pod webhook changes nothing it refuses); the svc plugin
    gives the pods their stable names but, told so, no NetworkPolicy (which would block
    Prometheus); the job Succeeds; Volcano's webhook kept our maxRetry."""
    ns = devcluster.namespace("vc-gang", RESTRICTED)
    name = "gang"
    path = write_spec(devcluster.root, gang(name, ns, nodes=2, gpus=2), f"{name}.yaml")
    submit = devcluster.gpufleet("submit", str(path), "--target", "volcano")
    assert submit.returncode == 0, submit.stderr[-2000:]
    phase, pods = devcluster.run_to_end(name, ns)
    assert phase == "Succeeded"
    assert sorted(pods) == [f"{name}-worker-0", f"{name}-worker-1"]
    for pod in pods.values():
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (
            pod["metadata"]["name"], name)  # fmt: skip
    policies = devcluster.typed("NetworkingV1Api").list_namespaced_network_policy(ns).items
    assert not policies, [p.metadata.name for p in policies]
    job = stored(devcluster, ns, name)
    assert job["spec"]["maxRetry"] == 2  # the spec's maxRestarts, as rendered
    cancel_clean(devcluster, ns, name)


def test_a_volcano_gang_larger_than_the_free_gpus_binds_no_pod(devcluster: DevCluster) -> None:
    """4 nodes x 4 GPUs on a cluster of 12: vc-scheduler binds none of the pods (all or
    nothing), and `gpufleet status` gives the gang's reason in one line."""
    ns = devcluster.namespace("vc-big")
    name = "too-big"
    path = write_spec(devcluster.root, gang(name, ns, nodes=4, gpus=4), f"{name}.yaml")
    assert devcluster.gpufleet("submit", str(path), "--target", "volcano").returncode == 0
    try:

        def reason() -> str:
            st = devcluster.gpufleet("status", name, "-n", ns)
            return st.stdout if "gang unschedulable" in st.stdout else ""

        out = poll_until(reason, what="Volcano's gang verdict in status", timeout=90)
        assert len(out.strip().splitlines()) == 1, out
        assert "Pending" in out and "minAvailable" in out, out
        time.sleep(5)  # vc-scheduler's cycle is 1 s: a pod it bound would show by now
        assert not [p for p in devcluster.pods(ns, name) if p["spec"].get("nodeName")]
    finally:
        cancel_clean(devcluster, ns, name)


def test_volcano_max_restarts_zero_ends_the_job_at_the_first_failure(
    devcluster: DevCluster,
) -> None:
    """maxRestarts 0: Volcano's webhook would turn maxRetry 0 into 3; gpufleet renders
    TerminateJob instead, so a worker exiting 1 ends the job Failed with no pod restarted."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    ns = devcluster.namespace("vc-once")
    name = "once"
    objects = render(validate_training_job(gang(name, ns, nodes=2, gpus=1, maxRestarts=0)),
                     "volcano")  # fmt: skip
    for task in objects[0]["spec"]["tasks"]:
        meta = task["template"].setdefault("metadata", {})
        meta["annotations"] = {**meta.get("annotations", {}), **exit_with(1), **NOT_KWOK_COMPLETE}
    Cluster(devcluster.custom, devcluster.core, ns).submit(objects)
    try:
        assert devcluster.wait_phase(name, ns, "Succeeded", "Failed") == "Failed"
        job = stored(devcluster, ns, name)
        assert job["status"].get("retryCount", 0) == 0, job["status"]
        assert [p["action"] for p in job["spec"]["policies"]] == ["TerminateJob"]
    finally:
        cancel_clean(devcluster, ns, name)
