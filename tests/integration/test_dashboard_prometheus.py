"""The fleet page's utilization beside allocation and its unhealthy GPUs (issue 53, item 2),
from a real Prometheus (the Debian package) evaluating gpufleet's rules over the exporter (two
simulated GPUs on node n1, their holders from a stand-in kubelet over its real gRPC API); one
GPU then falls off the bus (XID 79) and the page lists it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.sources import ClusterSource
from gpufleet.observe.devices import SimulatedDevice
from gpufleet.observe.exporter import GpuCollector
from gpufleet.observe.podresources import Attribution, PodLabels, list_allocations
from tests.support.fake_kube import FakeKube
from tests.support.kubelet import Kubelet, answering_kubelet, pods_api
from tests.support.procs import poll_until
from tests.support.prometheus import prometheus, static
from tests.support.scrape import serve, stop
from tests.unit.test_dashboard_fleet import node, pod

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]
PRODUCT = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with answering_kubelet() as k:
        yield k


def util(page: str, row: str) -> str | None:
    """The Utilization % cell of the row whose data attribute is ``row``."""
    found = re.search(rf'<tr {row}>.*?<td class="num util">([^<]*)</td>', page)
    return found.group(1) if found else None


def test_the_fleet_page_shows_utilization_and_the_gpu_that_fell_off_the_bus(
    kubelet: Kubelet, tmp_path: Path
) -> None:
    devices = [SimulatedDevice(0), SimulatedDevice(1)]
    attribution = Attribution(lambda: list_allocations(kubelet.socket), PodLabels(pods_api(), "n1"))
    exporter_url, exporter = serve(GpuCollector(devices, node="n1", attribution=attribution))
    kube = FakeKube()
    for obj in (node("n1", PRODUCT, 2), pod("trainer", "team-a", "n1", 2)):
        kube.put(obj)
    scrape = static("gpufleet-exporter", exporter_url.split("/")[2], honor_labels=True)
    try:
        with prometheus(tmp_path, [scrape]) as port:
            source = ClusterSource(kube.cluster("default"), prometheus=f"http://127.0.0.1:{port}")
            web = TestClient(create_app(tmp_path, source), base_url="http://127.0.0.1:8465")

            def shown() -> str | None:
                page = web.get("/fleet").text
                rows = (("node", "n1"), ("product", PRODUCT), ("tenant", f"team-a/{PRODUCT}"))
                cells = [util(page, f'data-{r}="{v}"') for r, v in rows]
                return page if all(c and c != "-" for c in cells) else None

            page = poll_until(shown, what="utilization on the fleet page", timeout=120, interval=1)
            assert 0 <= int(util(page, 'data-node="n1"') or -1) <= 100
            assert 'id="all-healthy"' in page
            devices[1].fail(79)  # fallen off the bus: no reads, one XID 79

            def listed() -> str | None:
                page = web.get("/fleet").text
                row = re.search(r'<tr data-gpu="n1/1">.*?</tr>', page, re.S)
                return page if row and "XID 79 (1 in 10 min)" in page else None

            page = poll_until(listed, what="the lost GPU on the fleet page", timeout=120,
                              interval=1)  # fmt: skip
            assert "not answering" in page and 'data-gpu="n1/0"' not in page
    finally:
        stop(exporter)


def test_a_prometheus_that_does_not_answer_leaves_allocation_alone(tmp_path: Path) -> None:
    kube = FakeKube()
    kube.put(node("n1", PRODUCT, 2))
    source = ClusterSource(kube.cluster("default"), prometheus="http://127.0.0.1:9")
    page = TestClient(create_app(tmp_path, source), base_url="http://127.0.0.1:8465").get("/fleet")
    assert page.status_code == 200 and 'id="no-prometheus"' in page.text
    assert "Prometheus at http://127.0.0.1:9" in page.text and 'data-node="n1"' in page.text
