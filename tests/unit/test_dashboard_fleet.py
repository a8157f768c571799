"""The dashboard's fleet page: GPUs by product, allocated against free (every pod the scheduler
placed and that has not ended, gpufleet's or not), by tenant and by node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.fleetpage import fleet_gpus, pod_gpus
from gpufleet.dashboard.sources import ClusterSource
from tests.support.fake_kube import FakeKube


def node(name: str, product: str | None, gpus: int, *, ready: bool = True, **spec: Any) -> Any:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    status = {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
              "conditions": [{"type": "Ready", "status": str(ready)}]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": spec, "status": status}  # fmt: skip


def pod(name: str, ns: str, on: str | None, gpus: int, phase: str = "Running") -> Any:
    limits = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": on, "containers": [{"name": "w", "resources": limits}]},
            "status": {"phase": phase}}  # fmt: skip


NODES = [node("h1", "NVIDIA-H100-80GB-HBM3", 8), node("h2", "NVIDIA-H100-80GB-HBM3", 8),
         node("a1", "NVIDIA-A30", 4, ready=False), node("a2", "NVIDIA-A30", 4, unschedulable=True),
         node("cpu", None, 0)]  # fmt: skip
PODS = [pod("r0", "research", "h1", 8), pod("r1", "research", "h2", 4),
        pod("p0", "product", "a1", 2), pod("done", "product", "a2", 4, "Succeeded"),
        pod("wait", "product", None, 4, "Pending"), pod("web", "product", "cpu", 0)]  # fmt: skip


def test_gpus_by_product_tenant_and_node() -> None:
    got = fleet_gpus(NODES, PODS)
    products = {p.product: (p.nodes, p.gpus, p.allocated, p.free) for p in got.products}
    assert products == {"NVIDIA-H100-80GB-HBM3": (2, 16, 12, 4), "NVIDIA-A30": (2, 8, 2, 6)}
    assert got.tenants == {"product": {"NVIDIA-A30": 2}, "research": {"NVIDIA-H100-80GB-HBM3": 12}}
    assert [n.name for n in got.nodes] == ["a1", "a2", "h1", "h2"]  # no GPU, no row
    assert [(n.ready, n.schedulable) for n in got.nodes[:2]] == [(False, True), (True, False)]


def test_a_pods_gpus_are_its_requests_or_limits_and_its_largest_init_container() -> None:
    spec = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}, {}],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}]}  # fmt: skip
    assert pod_gpus({"spec": spec}) == 3 and pod_gpus({}) == 0


def test_the_fleet_page_shows_them(tmp_path: Path) -> None:
    kube = FakeKube()
    for obj in NODES + PODS:
        kube.put(obj)
    app = TestClient(create_app(tmp_path, ClusterSource(kube.cluster("default"))),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    page = app.get("/fleet").text
    h100 = page.split('data-product="NVIDIA-H100-80GB-HBM3">')[1].split("</tr>")[0]
    assert [c.split("<")[0] for c in h100.split('class="num">')[1:]] == ["2", "16", "12", "4", "75"]
    assert 'data-tenant="research/NVIDIA-H100-80GB-HBM3"' in page and "NotReady" in page
