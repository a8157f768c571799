"""A real Prometheus (the Debian package) on 127.0.0.1 scrapes the exporter and a running
2-worker job; its HTTP API shows the series, the recording rules, and the step counter rising.
The exporter reads GPU allocations from a stand-in kubelet, so the usage rules (per namespace,
per tenant) run on real scrapes too."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.net import free_port
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.kubelet import Kubelet, answering_kubelet
from tests.support.procs import poll_until, stop_processes
from tests.support.prometheus import prometheus, query, static
from tests.support.scrape import served_port
from tests.support.specs import digits_job, write_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return poll_until(check, what=what, timeout=timeout, interval=0.5, retry_on=(OSError,))


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with answering_kubelet() as k:
        yield k


def test_prometheus_scrapes_exporter_and_training_job(workdir: Path, kubelet: Kubelet) -> None:
    exporter = subprocess.Popen(
        gpufleet_cmd("exporter", "--simulate", "2", "--port", "0", "--node", "n1",
                     "--pod-resources", kubelet.socket),
        cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        exp_port, job_port = served_port(exporter), free_port()
    except BaseException:
        stop_processes([exporter])
        raise
    scrapes = [static("gpufleet-exporter", f"127.0.0.1:{exp_port}"),
               static("gpufleet-job", f"127.0.0.1:{job_port}")]  # fmt: skip
    doc = digits_job(
        "promjob",
        # Longer than the checks take on a loaded machine (stopped after them): a 400-step job
        # once ended while the GPU series were awaited, and its step never rose again.
        workload={"name": "digits", "steps": 20000, "batchSize": 16, "logEvery": 10},
        checkpoint={"everySteps": 500, "keep": 2},
        metrics={"port": job_port},
    )
    procs = [
        exporter,
        subprocess.Popen(
            gpufleet_cmd("run", str(write_spec(workdir, doc))),
            cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    with prometheus(workdir, scrapes) as prom_port:
        try:
            check_series(prom_port)
        finally:
            stop_processes(procs)


def check_series(prom_port: int) -> None:
    """The GPU series, the recording rules, the usage rules and the job's step counter."""
    up = wait_for(lambda: len(query(prom_port, "gpufleet_gpu_up == 1")) == 2, 60, "GPU series")
    assert up
    wait_for(lambda: query(prom_port, "node:gpufleet_gpu_utilization:avg"), 30, "a recording rule")
    # GPU usage attributed through the kubelet: team-a's pod holds GPUs 0 and 1.
    held = wait_for(
        lambda: query(prom_port, 'tenant:gpufleet_gpus_allocated:sum{tenant="team-a"}'),
        30, "GPUs allocated per tenant",
    )  # fmt: skip
    assert float(held[0]["value"][1]) == 2
    busy = wait_for(
        lambda: query(prom_port, 'namespace:gpufleet_gpu_utilization:avg{namespace="team-a"}'),
        30, "GPU utilization per namespace",
    )  # fmt: skip
    assert 0 <= float(busy[0]["value"][1]) <= 1

    def steps() -> dict[str, float]:
        result = query(prom_port, 'gpufleet_job_step{job_name="promjob"}')
        return {r["metric"]["rank"]: float(r["value"][1]) for r in result}

    first = wait_for(lambda: (s := steps()) and len(s) == 2 and min(s.values()) > 0 and s,
                     90, "step series from both ranks")  # fmt: skip
    later = wait_for(
        lambda: (s := steps()) and min(s.values()) > max(first.values()) and s,
        90,
        "the step counter to rise",
    )
    assert min(later.values()) > max(first.values())
    rate = wait_for(
        lambda: query(prom_port, 'sum(rate(gpufleet_job_samples_total[10s])) > 0'),
        60, "a positive samples/s rate",
    )  # fmt: skip
    assert float(rate[0]["value"][1]) > 0
    targets = {t["metric"]["job"]: t["value"][1] for t in query(prom_port, "up")}
    assert targets == {"gpufleet-exporter": "1", "gpufleet-job": "1"}
