"""`gpufleet doctor` on the real-node cluster with the lab chart installed: nothing FAILs (exit
0). Its DNS is CoreDNS on the host bridge, found as a cluster's own is (Service kube-dns in
kube-system with a ready endpoint); the chart's tenants enforce `restricted`; what the nodes
lack for real GPUs is a WARN: no NVIDIA device plugin (the GPUs are an extended resource)."""

from __future__ import annotations

import json

import pytest

from tests.support.devcluster import DevCluster

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
