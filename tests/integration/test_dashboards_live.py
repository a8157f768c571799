"""Every dashboard panel's query returns data from a real Prometheus (the Debian package) that
scrapes, all on this machine, what the panels read: the exporter (simulated GPUs, allocations
from a stand-in kubelet over its real gRPC API, pod labels as the API server gives them), a
2-worker training job's metrics port, and `gpufleet serve`'s Triton under inference traffic.
The Queues dashboard reads Kueue: test_devcluster_queues runs its queries against Kueue."""

from __future__ import annotations

import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.net import free_port
from gpufleet.observe.devices import SimulatedDevice
from gpufleet.observe.exporter import GpuCollector
from gpufleet.observe.podresources import Attribution, PodLabels, list_allocations
from gpufleet.serve.export import export
from gpufleet.serve.repository import Batching
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.kubelet import Kubelet, answering_kubelet, pods_api
from tests.support.oip import INFER, MODEL, infer_body
from tests.support.paths import REPO
from tests.support.procs import stop_processes
from tests.support.prometheus import panel_queries, prometheus, static, without_data
from tests.support.scrape import serve, stop
from tests.support.specs import digits_job, write_spec
from tests.support.triton import start_cli_serve, trained_checkpoint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]
pytest.importorskip("pytriton")

DASHBOARDS = sorted(p for p in (REPO / "deploy" / "grafana").glob("*.json") if p.stem != "queues")
# (dashboard, panel, target index) -> why it may show nothing on a healthy fleet.
EMPTY_BY_DESIGN = {
    ("tenants-queues.json", "Allocated GPUs under 5% utilization", 0): (
        "lists offenders only; a simulated GPU is never under 5% busy"
    ),
}


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with answering_kubelet() as k:
        yield k


def send_requests(http: str, stop_at: threading.Event) -> None:
    """One small infer request every 0.2 s until told to stop (bounded by the test's timeout)."""
    body = infer_body([4, 1, 8, 8])
    while not stop_at.wait(0.2):
        request = urllib.request.Request(f"{http}{INFER}", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                resp.read()
        except OSError:
            pass  # the panels wait for the next one


def test_every_dashboard_panel_returns_data(
    workdir: Path, kubelet: Kubelet, tmp_path: Path
) -> None:
    queries = panel_queries(DASHBOARDS)
    assert len(queries) > 40
    repo = tmp_path / "repo"
    trained_checkpoint(tmp_path / "run" / "checkpoints")
    export(str(tmp_path / "run"), repo, model=MODEL,
           batching=Batching(max_batch_size=64, preferred_batch_sizes=(16, 32, 64)))  # fmt: skip
    attribution = Attribution(lambda: list_allocations(kubelet.socket), PodLabels(pods_api(), "n1"))
    collector = GpuCollector([SimulatedDevice(0), SimulatedDevice(1)], node="n1",
                             attribution=attribution)  # fmt: skip
    exporter_url, exporter = serve(collector)
    job_port = free_port()
    serving, ports, lines = start_cli_serve(repo, tmp_path)
    assert lines and lines[-1].startswith("serving:"), lines
    doc = digits_job(
        "dashjob",
        workload={"name": "digits", "steps": 100000, "batchSize": 16, "logEvery": 100},
        checkpoint={"everySteps": 50, "keep": 2},
        metrics={"port": job_port},
    )
    job = subprocess.Popen(
        gpufleet_cmd("run", str(write_spec(workdir, doc))),
        cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    done = threading.Event()
    traffic = threading.Thread(
        target=send_requests, args=(f"http://127.0.0.1:{ports[0]}", done), daemon=True
    )
    traffic.start()
    scrapes = [
        static("gpufleet-exporter", exporter_url.split("/")[2], honor_labels=True),
        static("gpufleet-job", f"127.0.0.1:{job_port}"),
        static("triton", f"127.0.0.1:{ports[2]}"),
    ]
    try:
        with prometheus(workdir, scrapes) as port:
            empty = without_data(port, queries, set(EMPTY_BY_DESIGN), timeout=300)
        # every other panel has data, and no reason above is stale: those are still empty
        assert set(empty) == set(EMPTY_BY_DESIGN), {
            k: empty[k] for k in set(empty) - set(EMPTY_BY_DESIGN)
        }
    finally:
        done.set()
        stop_processes([serving, job], timeout=60)
        if serving.stderr is not None:
            serving.stderr.close()
        stop(exporter)
        traffic.join(timeout=15)
