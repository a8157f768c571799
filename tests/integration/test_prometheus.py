"""A real Prometheus (the Debian package) on 127.0.0.1 scrapes the exporter and a running
2-worker job; its HTTP API shows the series, the recording rules, and the step counter rising.
The exporter reads GPU allocations from a stand-in kubelet, so the usage rules (per namespace,
per tenant) run on real scrapes too."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.net import free_port
from tests.conftest import REPO, cli_env, digits_job, gpufleet_cmd, poll_until, write_spec
from tests.kubelet import Kubelet, compiled_upstream, kubelet_answer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (make tools)"
    ),
]


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return poll_until(check, what=what, timeout=timeout, interval=0.5, retry_on=(OSError,))


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    with compiled_upstream() as upstream:
        k = Kubelet(upstream, kubelet_answer(upstream[0]))
        yield k
        k.close()


def test_prometheus_scrapes_exporter_and_training_job(workdir: Path, kubelet: Kubelet) -> None:
    prom_port, exp_port, job_port = free_port(), free_port(), free_port()
    rules = workdir / "rules.yaml"
    shutil.copy(REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml", rules)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "gpufleet-exporter",
             "static_configs": [{"targets": [f"127.0.0.1:{exp_port}"]}]},
            {"job_name": "gpufleet-job",
             "static_configs": [{"targets": [f"127.0.0.1:{job_port}"]}]},
        ],
    }  # fmt: skip
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    doc = digits_job(
        "promjob",
        workload={"name": "digits", "steps": 400, "batchSize": 16, "logEvery": 10},
        checkpoint={"everySteps": 50, "keep": 2},
        metrics={"port": job_port},
    )
    procs = [
        subprocess.Popen(
            ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            gpufleet_cmd("exporter", "--simulate", "2", "--port", str(exp_port), "--node", "n1",
                         "--pod-resources", kubelet.socket),
            cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            gpufleet_cmd("run", str(write_spec(workdir, doc))),
            cwd=workdir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        up = wait_for(lambda: len(query(prom_port, "gpufleet_gpu_up == 1")) == 2, 60, "GPU series")
        assert up
        wait_for(
            lambda: query(prom_port, "node:gpufleet_gpu_utilization:avg"), 30, "a recording rule"
        )
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
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
