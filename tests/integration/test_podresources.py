"""GPU -> pod/job/tenant attribution: the kubelet pod-resources client against a stand-in kubelet.

The stand-in is a real gRPC server on a unix socket, built from an independent transcription of
upstream's api.proto (tests/fixtures/kubelet) compiled by grpcio-tools, and it answers with
fields gpufleet's client does not know (CPU IDs, memory, topology, DRA claims).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.observe.devices import SimulatedDevice
from gpufleet.observe.exporter import GpuCollector, registry_for
from gpufleet.observe.podresources import (
    Allocation,
    Attribution,
    PodLabels,
    PodResourcesClient,
    list_allocations,
    owner_of,
)
from tests.support.cli import cli_env, gpufleet_cmd
from tests.support.kubelet import (
    GPU0,
    GPU1,
    POD_LABELS,
    Kubelet,
    compiled_upstream,
    kubelet_answer,
    pods_api,
)
from tests.support.procs import poll_until
from tests.support.scrape import scrape, serve, stop


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[ModuleType, ModuleType]]:
    with compiled_upstream() as modules:
        yield modules


@pytest.fixture
def kubelet(upstream: tuple[ModuleType, ModuleType]) -> Iterator[Kubelet]:
    k = Kubelet(upstream, kubelet_answer(upstream[0]))
    yield k
    k.close()


def test_list_reads_gpu_devices_and_skips_what_it_does_not_know(kubelet: Kubelet) -> None:
    allocations = list_allocations(kubelet.socket)
    assert allocations == [
        Allocation("team-a", "llm-worker-0-0-abcde", "worker", "nvidia.com/gpu", GPU0),
        Allocation("team-a", "llm-worker-0-0-abcde", "worker", "nvidia.com/gpu", GPU1),
        Allocation("team-b", "notebook", "lab", "nvidia.com/gpu", "1::0"),
        Allocation("team-b", "notebook", "lab", "nvidia.com/gpu", "1::3"),
        Allocation("team-b", "mig-pod", "c", "nvidia.com/mig-1g.10gb", "MIG-abc"),
    ]
    assert allocations[2].gpu_id == "1"


def test_client_keeps_its_channel_and_reconnects_after_a_kubelet_restart(
    kubelet: Kubelet,
) -> None:
    client = PodResourcesClient(kubelet.socket, timeout=2)
    try:
        assert len(client()) == len(client()) == 5
        kubelet.restart()
        # grpcio backs off after the broken connection, then reconnects
        allocations = poll_until(client, what="a reconnect", timeout=15, retry_on=(grpc.RpcError,))
        assert len(allocations) == 5
    finally:
        client.close()


def test_owner_from_labels_of_every_engine() -> None:
    assert owner_of("team-a", POD_LABELS[("team-a", "llm-worker-0-0-abcde")]).job_name == "llm"
    assert owner_of("ns", {"jobset.sigs.k8s.io/jobset-name": "js"}).job_name == "js"
    assert owner_of("ns", {"training.kubeflow.org/job-name": "pj"}).job_name == "pj"
    assert owner_of("ns", {"batch.kubernetes.io/job-name": "bj"}).job_name == "bj"
    kueue = owner_of("ns", {"kueue.x-k8s.io/queue-name": "q1"})
    assert (kueue.job_name, kueue.tenant, kueue.queue) == ("", "ns", "q1")
    assert owner_of("ns", None).tenant == "ns"


def allocated(samples: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any]:
    return {
        f"{labels['pod']}/{labels['uuid']}": (labels, value)
        for labels, value in samples.get("gpufleet_gpu_allocated", [])
    }


def test_scrape_attributes_gpus_to_pods_jobs_tenants_and_queues(kubelet: Kubelet) -> None:
    core = pods_api()
    attribution = Attribution(lambda: list_allocations(kubelet.socket), PodLabels(core, "n1"))
    devices = [SimulatedDevice(0), SimulatedDevice(1)]
    url, server = serve(GpuCollector(devices, node="n1", attribution=attribution))
    try:
        status, samples, _ = scrape(url)
        scrape(url)
    finally:
        stop(server)
    assert status == 200
    (call,) = core.called("list_pod_for_all_namespaces")  # pod labels are cached between scrapes
    assert call["field_selector"] == "spec.nodeName=n1"
    got = allocated(samples)
    labels, value = got[f"llm-worker-0-0-abcde/{GPU1}"]
    assert value == 1
    assert labels | {"model": ""} == {
        "gpu": "1",
        "uuid": GPU1,
        "model": "",
        "node": "n1",
        "namespace": "team-a",
        "pod": "llm-worker-0-0-abcde",
        "container": "worker",
        "job_name": "llm",
        "tenant": "team-a",
        "queue": "team-a",
        "resource": "nvidia.com/gpu",
    }
    # Time-sliced replicas of GPU 1 (index IDs): one series, two shares, tenant = namespace.
    labels, value = got[f"notebook/{GPU1}"]
    assert (labels["gpu"], value, labels["tenant"], labels["job_name"]) == ("1", 2, "team-b", "")
    # A MIG slice keeps its own ID; it joins no whole-GPU series.
    labels, _ = got["mig-pod/MIG-abc"]
    assert labels["gpu"] == "" and labels["resource"] == "nvidia.com/mig-1g.10gb"
    assert samples["gpufleet_exporter_pod_resources_up"][0][1] == 1
    assert len(got) == 4


def test_kubelet_missing_or_slow_never_fails_the_scrape(kubelet: Kubelet) -> None:
    missing = Attribution(lambda: list_allocations("/nonexistent/kubelet.sock", timeout=0.2))
    kubelet.delay = 30
    slow = Attribution(lambda: list_allocations(kubelet.socket, timeout=10))
    for attribution in (missing, slow):
        collector = GpuCollector(
            [SimulatedDevice(0)], node="n1", deadline=0.5, attribution=attribution
        )
        url, server = serve(collector)
        try:
            status, samples, elapsed = scrape(url)
        finally:
            stop(server)
        assert status == 200 and elapsed < 5.0  # not the list's 10 s timeout: the 0.5 s deadline
        assert samples["gpufleet_gpu_up"][0][1] == 1
        assert samples["gpufleet_exporter_pod_resources_up"][0][1] == 0
        assert "gpufleet_gpu_allocated" not in samples


def test_pod_label_errors_keep_the_last_answer() -> None:
    core = pods_api()
    labels = PodLabels(core, "n1", refresh=10)
    assert labels.get(now=0)[("team-b", "notebook")] == {"app": "jupyter"}
    core.fail_with = 403
    assert labels.get(now=5) == labels.get(now=0)  # not refreshed yet
    assert len(core.calls) == 1
    assert labels.get(now=11)[("team-b", "notebook")] == {"app": "jupyter"}
    assert labels.error and "Forbidden" in labels.error
    core.fail_with = None
    labels.get(now=22)
    assert labels.error is None


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make tools)")
def test_promtool_accepts_the_allocation_series(kubelet: Kubelet) -> None:
    labels = PodLabels(pods_api(), "n1")
    attribution = Attribution(lambda: list_allocations(kubelet.socket), labels)
    collector = GpuCollector(
        [SimulatedDevice(0), SimulatedDevice(1)], node="n1", attribution=attribution
    )
    text = generate_latest(registry_for(collector))
    assert b"gpufleet_gpu_allocated{" in text
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_cli_serves_allocations_from_the_socket(kubelet: Kubelet) -> None:
    proc = subprocess.Popen(
        gpufleet_cmd(
            "exporter", "--simulate", "2", "--port", "0", "--pod-resources", kubelet.socket
        ),
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = line.split(" at ")[1].split()[0]
        samples = poll_until(
            lambda: (s := scrape(url)[1]).get("gpufleet_gpu_allocated") and s,
            what="gpufleet_gpu_allocated series",
            timeout=20,
        )
        got = allocated(samples)
        assert got[f"llm-worker-0-0-abcde/{GPU0}"][0]["tenant"] == "team-a"  # no labels: ns
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_cli_pod_labels_need_the_socket() -> None:
    result = CliRunner().invoke(app, ["exporter", "--pod-labels", "--simulate", "1"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "--pod-labels" in result.output and "--pod-resources" in result.output
