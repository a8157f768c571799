"""`gpufleet doctor` on the real-node cluster with the lab chart installed: nothing FAILs (exit
0). Its DNS is CoreDNS on the host bridge, found as a cluster's own is (Service kube-dns in
kube-system with a ready endpoint); the chart's tenants enforce `restricted`; what the nodes
lack for real GPUs is a WARN: no NVIDIA device plugin (the GPUs are an extended resource). The
chart's workloads are ready; one that cannot start is a FAIL with the kubelet's reason."""

from __future__ import annotations

import json

import pytest

from gpufleet.devcluster import platform
from tests.support.devcluster import DevCluster
from tests.support.paths import REPO
from tests.support.procs import poll_until

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes]


def test_the_real_node_cluster_with_the_lab_chart_passes_doctor(reallab: DevCluster) -> None:
    done = reallab.gpufleet("doctor", "-o", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert checks["dns"]["status"] == "OK" and "1 ready endpoint" in checks["dns"]["detail"]
    security = checks["pod security"]
    assert security["status"] == "OK" and "product, research" in security["detail"]
    assert checks["gpu nodes"]["status"] == "OK"
    assert checks["device plugin"]["status"] == "WARN"
    assert checks["kueue integrations"]["status"] == "OK"
    workloads = checks["platform"]
    assert workloads["status"] == "OK", workloads
    assert f"DaemonSet {platform.NAMESPACE}/gpufleet-exporter" in workloads["detail"]


def test_an_exporter_that_cannot_mount_the_kubelets_socket_is_one_fail_line(
    reallab: DevCluster,
) -> None:
    """With pod-resources on, the exporter mounts /var/lib/kubelet/pod-resources, which these
    nodes' kubelets (rooted in the cluster's directory) do not have: the kubelet refuses the
    mount, and doctor says so on one line, with the value to set. The release is rolled back."""
    chart, on = str(REPO / platform.CHART), "monitoring.exporter.podResources.enabled=true"
    reallab.helm("upgrade", platform.RELEASE, chart, "-n", platform.NAMESPACE, "--reuse-values",
                 "--set", on)  # fmt: skip
    try:

        def failing() -> dict[str, str] | None:
            done = reallab.gpufleet("doctor", "-o", "json")
            line = {c["check"]: c for c in json.loads(done.stdout)["checks"]}["platform"]
            return line if "FailedMount" in line["detail"] else None

        line = poll_until(failing, what="doctor to name the failed mount", timeout=90, interval=2)
        assert line["status"] == "FAIL", line
        assert "exporter on real-" in line["detail"], line
        assert "/var/lib/kubelet/pod-resources" in line["detail"], line
        assert "monitoring.exporter.podResources.kubeletDir" in line["fix"], line
    finally:
        reallab.helm("rollback", platform.RELEASE, "-n", platform.NAMESPACE, "--wait",
                     "--timeout", "120s")  # fmt: skip
