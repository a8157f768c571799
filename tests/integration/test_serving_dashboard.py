"""The serving page's requests and latency (issue 53, item 2), from the real parts: the digits
model served by real Triton (the shared fixture `served`), a real Prometheus that scrapes
Triton's metrics port as the cluster's scrapes a serving pod (with its namespace and pod
labels), and requests sent with tritonclient. The page's mean latency is Triton's own: under
the round trip the client measured."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.sources import ClusterSource
from tests.support.fake_kube import FakeKube
from tests.support.oip import MODEL
from tests.support.procs import poll_until
from tests.support.prometheus import prometheus
from tests.support.triton import Served
from tests.unit.test_dashboard_serving import HPA, rendered, server_pod

tritonclient_http = pytest.importorskip("tritonclient.http")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]
REQUESTS = 40


def cell(page: str, name: str) -> str | None:
    """The team-a/digits row's ``name`` cell (rps, latency, queue)."""
    found = re.search(rf'data-name="team-a/digits".*?<td class="num {name}">([^<]*)</td>', page,
                      re.S)  # fmt: skip
    return found.group(1) if found else None


def test_the_serving_page_shows_tritons_requests_and_their_latency(
    served: Served, tmp_path: Path
) -> None:
    kube = FakeKube()
    for obj in [*rendered("digits", "team-a", HPA), server_pod("digits-0", "team-a", "digits")]:
        kube.put(obj)
    target = served.endpoints.metrics.removeprefix("http://").split("/")[0]
    scrape = {"job_name": "triton", "static_configs": [
        {"targets": [target], "labels": {"namespace": "team-a", "pod": "digits-0"}}]}  # fmt: skip
    client = tritonclient_http.InferenceServerClient(served.host)
    x = served.images[:8]
    with prometheus(tmp_path, [scrape]) as port:
        source = ClusterSource(kube.cluster("team-a"), prometheus=f"http://127.0.0.1:{port}")
        web = TestClient(create_app(tmp_path, source), base_url="http://127.0.0.1:8465")
        poll_until(lambda: cell(web.get("/serving").text, "rps") not in (None, "-"),
                   what="Triton's counters in Prometheus", timeout=60, interval=1)  # fmt: skip
        took = []
        try:
            for _ in range(REQUESTS):
                inp = tritonclient_http.InferInput("INPUT__0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                start = time.monotonic()
                client.infer(MODEL, [inp])
                took.append(1000 * (time.monotonic() - start))
        finally:
            client.close()
        page = poll_until(lambda: measured(web), what="the latency on the serving page",
                          timeout=60, interval=1)  # fmt: skip
    latency, queue, rps = (float(cell(page, c) or "nan") for c in ("latency", "queue", "rps"))
    assert rps > 0 and 0 <= queue <= latency, page
    # Triton's time for a request is within its round trip, which adds the client and HTTP (a
    # scrape may fall amid the requests: the mean of some of them, within the longest trip)
    assert 0 < latency <= max(took), (latency, took)


def measured(web: TestClient) -> str | None:
    """The page once it shows a latency and a rate above 0.0 a second: a scrape amid the first
    requests gives a rate of one request a minute, which the page rounds to 0.0."""
    page = web.get("/serving").text
    shown = cell(page, "latency") not in (None, "-") and cell(page, "rps") not in ("0.0", "-")
    return page if shown else None
