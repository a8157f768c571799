"""`gpufleet cluster up --real-nodes`: real kubelets with containerd and runc, built from their
Go modules, join the local control plane and run containers under Pod Security `restricted`;
`down` leaves the host as it was (the realcluster fixture checks it at the session's end).

The cluster is the session's real-node cluster (tests/support/realnodes.py); each test works in
a namespace of its own."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.devcluster.realnodes.configs import SANDBOX_IMAGE
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import REAL_NODES

# The first test here may start the real-node cluster: importing a new image into both nodes
# takes minutes on 2 cores (test setup counts toward the timeout).
pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def real_nodes(cluster: DevCluster) -> list[Any]:
    return [n for n in cluster.core.list_node().items if n.metadata.name.startswith("real-")]


def test_real_nodes_register_with_their_runtime_gpus_and_the_flavor_labels(
    realcluster: DevCluster,
) -> None:
    nodes = real_nodes(realcluster)
    assert len(nodes) == REAL_NODES
    for node in nodes:
        info = node.status.node_info
        assert info.container_runtime_version == "containerd://2.4.2"
        assert info.kubelet_version == "v1.36.3"
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A30"
        assert [t.key for t in node.spec.taints or []] == ["nvidia.com/gpu"]
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready[0].status == "True", ready
    addresses = {n.status.addresses[0].address for n in nodes}
    assert len(addresses) == REAL_NODES and not any(a.startswith("127.") for a in addresses)


def test_a_restricted_pod_runs_a_real_container_on_each_node(realcluster: DevCluster) -> None:
    namespace = realcluster.namespace("real-pause", RESTRICTED)
    names = [n.metadata.name for n in real_nodes(realcluster)]
    for node in names:
        realcluster.core.create_namespaced_pod(namespace, {
            "metadata": {"name": f"pause-{node}"},
            "spec": {
                "nodeName": node,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65535,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "pause", "image": SANDBOX_IMAGE, "imagePullPolicy": "Never",
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        })  # fmt: skip

    def running() -> bool:
        pods = realcluster.core.list_namespaced_pod(namespace).items
        states = [p.status.container_statuses for p in pods]
        return len(pods) == len(names) and all(s and s[0].state.running for s in states)

    poll_until(running, timeout=60, what="a pause container running on each real node")
    pods = realcluster.core.list_namespaced_pod(namespace).items
    assert sorted(p.spec.node_name for p in pods) == sorted(names)
    assert all(p.status.container_statuses[0].container_id.startswith("containerd://")
               for p in pods)  # fmt: skip
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == len(names) and all(ip.startswith("10.245.") for ip in ips)


def test_cluster_status_names_each_real_nodes_kubelet_and_runtime(
    realcluster: DevCluster,
) -> None:
    status = realcluster.gpufleet("cluster", "status", "--dir", str(realcluster.dir))
    assert status.returncode == 0, status.stderr
    lines = set(status.stdout.splitlines())
    for node in real_nodes(realcluster):
        for component in ("kubelet", "containerd", "kube-proxy"):
            assert f"{component}@{node.metadata.name}: running" in lines, status.stdout
    assert "coredns: running" in lines
