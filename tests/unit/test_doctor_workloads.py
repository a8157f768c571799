"""`gpufleet doctor` on the platform chart's own workloads (cluster/doctor/workloads.py): all
ready is one OK line; each one short of ready pods is a FAIL with the kubelet's reason for its
first such pod and the value to set (issue 51: the exporter on real nodes whose kubelet keeps
its root elsewhere, or whose image is not there)."""

from __future__ import annotations

from typing import Any

from gpufleet.cluster.doctor import Facts, Status, diagnose
from gpufleet.cluster.doctor.workloads import chart_workloads

CHART = {"helm.sh/chart": "gpufleet-0.1.0", "app.kubernetes.io/component": "exporter"}
SELECTOR = {"app.kubernetes.io/name": "gpufleet", "app.kubernetes.io/component": "exporter"}
MOUNT = ('MountVolume.SetUp failed for volume "pod-resources" : hostPath type check failed: '
         "/var/lib/kubelet/pod-resources is not a directory")  # fmt: skip


def exporter(ready: int, wanted: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": "gpufleet-exporter", "namespace": "gpufleet-system",
                         "labels": CHART},
            "spec": {"selector": {"matchLabels": SELECTOR}},
            "status": {"desiredNumberScheduled": wanted, "numberReady": ready}}  # fmt: skip


def pod(name: str, *, ready: bool = False, waiting: dict[str, str] | None = None) -> dict[str, Any]:
    state = {"waiting": waiting or {"reason": "ContainerCreating"}}
    return {"metadata": {"name": name, "namespace": "gpufleet-system", "labels": SELECTOR},
            "spec": {"nodeName": f"node-{name[-1]}"},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}],
                       "containerStatuses": [{"name": "exporter", "state": state}]}}  # fmt: skip


def warning(about: str, reason: str, message: str, at: str = "2026-12-05T09:00:00Z") -> Any:
    return {"type": "Warning", "reason": reason, "message": message, "lastTimestamp": at,
            "involvedObject": {"name": about}}  # fmt: skip


def test_a_ready_platform_is_one_ok_line_and_no_chart_is_none() -> None:
    deployment = {"metadata": {"name": "gpufleet-mirror", "namespace": "gpufleet-system",
                               "labels": CHART},
                  "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}  # fmt: skip
    (line,) = chart_workloads(Facts(daemonsets=[exporter(2)], deployments=[deployment]))
    assert line.status is Status.OK and line.check == "platform"
    assert line.detail == ("2 workloads ready: DaemonSet gpufleet-system/gpufleet-exporter, "
                           "Deployment gpufleet-system/gpufleet-mirror")  # fmt: skip
    served = {
        **deployment,
        "metadata": {**deployment["metadata"], "labels": {"app.kubernetes.io/part-of": "gpufleet"}},
        "status": {},
    }  # a job's server: no chart's
    assert chart_workloads(Facts(deployments=[served])) == []
    assert "platform" not in {f.check for f in diagnose(Facts(), [])}


def test_a_failed_mount_names_the_node_the_kubelets_reason_and_the_value() -> None:
    facts = Facts(daemonsets=[exporter(0)], platform_pods=[pod("x-0"), pod("x-1")],
                  platform_events=[warning("x-0", "FailedMount", "older", "2026-12-05T08:00:00Z"),
                                   warning("x-0", "FailedMount", MOUNT)])  # fmt: skip
    (line,) = chart_workloads(facts)
    assert line.status is Status.FAIL
    assert line.detail == (f"DaemonSet gpufleet-system/gpufleet-exporter: exporter on node-0: "
                           f"FailedMount: {MOUNT}")  # fmt: skip
    assert "monitoring.exporter.podResources.kubeletDir" in line.fix
    assert "podResources.enabled=false" in line.fix


def test_an_image_the_node_lacks_and_a_refused_pod_each_say_what_to_do() -> None:
    never = {"reason": "ErrImageNeverPull",
             "message": 'Container image "ghcr.io/gpufleet/gpufleet:0.1.0" is not present '
                        "with pull policy of Never"}  # fmt: skip
    facts = Facts(daemonsets=[exporter(1)],
                  platform_pods=[pod("x-0", ready=True), pod("x-1", waiting=never)])  # fmt: skip
    (line,) = chart_workloads(facts)
    assert "exporter on node-1: ErrImageNeverPull: Container image" in line.detail
    assert "cluster up --image" in line.fix
    refused = 'pods is forbidden: violates PodSecurity "restricted:latest": hostPath volumes'
    facts = Facts(
        daemonsets=[exporter(0)],
        platform_events=[warning("gpufleet-exporter", "FailedCreate", refused)],
    )
    (line,) = chart_workloads(facts)
    assert line.detail.endswith(f"exporter: FailedCreate: {refused}") and "Pod Security" in line.fix
    quiet = chart_workloads(Facts(daemonsets=[exporter(0)], platform_pods=[pod("x-0")]))
    assert quiet[0].detail.endswith("exporter: no ready pod yet")
    assert "describe pods -l app.kubernetes.io/name=gpufleet" in quiet[0].fix


def test_pods_that_could_not_be_read_are_said_so() -> None:
    facts = Facts(daemonsets=[exporter(0)], errors={"platform": "pods: forbidden"})
    (line,) = chart_workloads(facts)
    assert line.status is not Status.OK and "pods: forbidden" in line.detail
