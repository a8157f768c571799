"""Autoscaling under load on real nodes (issue 29, item 5): the InferenceService of
examples/digits-serving.yaml (its batching and its autoscaler: an HPA on the mean queue time,
20 ms; served by `gpufleet serve` from the project's image, one replica up to two, no CPU
request, a 10 s scale-down delay) on the real-node cluster with its metrics pipeline
(`cluster up --metrics-pipeline`: Prometheus and Prometheus Adapter built from their modules).

A pod of the tenant runs MLPerf LoadGen (`gpufleet bench inference`, Offline, one run after
another, each with new connections) against the Service. The HPA reads the metric through the
API server's custom metrics API and scales to two replicas; the second one takes no inference
request before it is Ready (Prometheus' samples of its Triton counters) and its share after; no
request fails; the dashboard's serving page shows, in Chromium, both replicas, the requests
per second and their latency. When the load stops, the HPA scales back to one. Measured: load
start to the second replica Ready, load end to one replica."""

from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpufleet.devcluster.nodes import GPU_TAINT
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from gpufleet.render.serving import ADAPTER_METRICS, HTTP
from tests.support.browser import chromium, dashboard, missing, screenshot
from tests.support.devcluster import DevCluster
from tests.support.paths import REPO
from tests.support.procs import poll_until
from tests.support.realnodes import (
    TENANT,
    pod_log,
    project_image,
    prometheus,
    prometheus_url,
    record,
)
from tests.support.realserving import MODEL, exported, ready_pods, served_by_gpufleet
from tests.support.specs import write_spec

T = TypeVar("T")

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
NAME, CLAIM, LOAD = "digits-scale", "scale-models", "loadgen"
EXAMPLE = REPO / "examples" / "digits-serving.yaml"
SCALE_DOWN_DELAY = 10  # seconds (the example keeps the default, five minutes)
GPU_NODES = {**GPU_TAINT, "operator": "Exists"}  # every real node is a GPU node

# The load: LoadGen Offline runs one after another until the pod is deleted, each run's verdict
# one JSON line with its start (a new run opens new connections, which the Service spreads over
# the replicas).
# 256 requests in flight, four of the model's largest batches: with 64 (one batch) the mean
# queue time stayed near 15 ms on this machine, under the example's 20 ms target.
LOAD_LOOP = """
import json, os, subprocess, sys, time
url, model = sys.argv[1], sys.argv[2]
while True:
    start = time.time()
    if os.path.exists("/tmp/lg/result.json"):
        os.remove("/tmp/lg/result.json")
    run = subprocess.run(["gpufleet", "bench", "inference", "--url", url, "--model", model,
                          "--scenario", "Offline", "--duration", "10", "--concurrency", "256",
                          "--outdir", "/tmp/lg"],
                         capture_output=True, text=True)
    try:
        result = json.load(open("/tmp/lg/result.json"))
    except (OSError, ValueError):
        result = {}
    print(json.dumps({"start": start, "rc": run.returncode, "errors": result.get("errors"),
                      "why": run.stderr[-300:] if not result else ""}), flush=True)
"""


def service_doc() -> dict[str, Any]:
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    autoscaling = {**example["autoscaling"], "scaleDownDelay": f"{SCALE_DOWN_DELAY}s"}
    return served_by_gpufleet(NAME, CLAIM, batching=example["batching"], autoscaling=autoscaling,
                              replicas={"min": 1, "max": 2})  # fmt: skip


@pytest.fixture
def service(reallab: DevCluster, tmp_path: Path) -> Iterator[None]:
    exported(reallab, tmp_path, CLAIM)
    submit = reallab.gpufleet("submit", str(write_spec(tmp_path, service_doc(), "svc.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    try:
        yield
    finally:
        stop_load(reallab)
        reallab.gpufleet("cancel", NAME, "-n", TENANT)
        poll_until(lambda: not reallab.pods(TENANT, NAME), what=f"{NAME}'s pods gone", timeout=90)
        reallab.core.delete_namespaced_persistent_volume_claim(CLAIM, TENANT)


def hpa(cluster: DevCluster) -> dict[str, Any]:
    api = cluster.typed("AutoscalingV2Api")
    return dict(cluster.as_dict(api.read_namespaced_horizontal_pod_autoscaler(NAME, TENANT)))


def metric_served(cluster: DevCluster) -> bool:
    """The HPA reads its metric (the adapter serves it for the pod)."""
    status = hpa(cluster).get("status", {})
    active = [c for c in status.get("conditions", []) if c["type"] == "ScalingActive"]
    return bool(active) and active[0]["status"] == "True" and bool(status.get("currentMetrics"))


def start_load(cluster: DevCluster) -> float:
    """The load pod (restricted, the project's image); when it was created."""
    container = {
        "name": "loadgen", "image": project_image()[0], "imagePullPolicy": "Never",
        "command": ["python", "-c", LOAD_LOOP, f"http://{NAME}:{HTTP}", MODEL],
        "env": [{"name": "HOME", "value": "/tmp"}], "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"cpu": "1", "memory": "1Gi"}},
    }  # fmt: skip
    pod = {"metadata": {"name": LOAD}, "spec": {
        "restartPolicy": "Never", "containers": [container], "tolerations": [GPU_NODES],
        "securityContext": POD_SECURITY, "volumes": [{"name": "tmp", "emptyDir": {}}],
    }}  # fmt: skip
    cluster.core.create_namespaced_pod(TENANT, pod)
    return time.time()


def scaling_state(cluster: DevCluster) -> str:
    """What the HPA saw and the load pod said, for a failure's message."""
    status = hpa(cluster).get("status", {})
    conditions = [f"{c['type']}={c['status']} {c.get('message', '')}"
                  for c in status.get("conditions", [])]  # fmt: skip
    return (f"HPA: {status.get('currentMetrics')} desired {status.get('desiredReplicas')}; "
            f"{conditions}\nload: {pod_log(cluster, LOAD)[-1500:]}")  # fmt: skip


def awaited(cluster: DevCluster, check: Callable[[], T | None], what: str, timeout: float) -> T:
    """poll_until's value; its failure says what the HPA saw and the load pod said."""
    try:
        return poll_until(check, what=what, timeout=timeout, interval=1)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{scaling_state(cluster)}")


def load_runs(cluster: DevCluster) -> list[dict[str, Any]]:
    """The load pod's finished runs (their JSON lines)."""
    return [json.loads(line) for line in pod_log(cluster, LOAD).splitlines() if line[:1] == "{"]


def runs_since(cluster: DevCluster, since: float) -> list[dict[str, Any]] | None:
    """The load pod's finished runs that started at ``since`` or later, once there is one."""
    runs = [r for r in load_runs(cluster) if r["start"] >= since]
    return runs or None


def two_ready(cluster: DevCluster) -> list[dict[str, Any]] | None:
    pods = ready_pods(cluster, NAME)
    return pods if len(pods) >= 2 else None


def epoch(stamp: str) -> float:
    """An API timestamp (RFC 3339, UTC, whole seconds) in seconds since the epoch."""
    return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))


def stop_load(cluster: DevCluster) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.delete_namespaced_pod(LOAD, TENANT, grace_period_seconds=0)
    except ApiException as exc:  # gone already
        assert exc.status == 404, exc


def ready_since(pod: dict[str, Any]) -> float:
    """When the pod became Ready."""
    (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    return epoch(ready["lastTransitionTime"])


def requests_of(pod: str) -> str:
    """Inference requests a pod's Triton answered, well or not."""
    return f'sum({{__name__=~"nv_inference_request_(success|failure)",pod="{pod}"}})'


def serving_row(page: Any, url: str, name: str) -> Any | None:
    """Service ``name``'s row on the dashboard's serving page (issue 53) in Chromium, once it
    shows a latency (`gpufleet dashboard --prometheus` reads it from the cluster's
    Prometheus)."""
    page.goto(f"{url}/serving")
    row = page.locator(f'#services tr[data-name="{TENANT}/{name}"]')
    shown = row.count() and re.fullmatch(r"[0-9.]+", row.locator(".latency").inner_text())
    return row if shown else None


def the_page_shows_the_load(cluster: DevCluster) -> None:
    """The serving page under the load: both replicas ready, requests per second and their
    latency (skipped where Chromium is missing: `make tools` installs it)."""
    if missing() is not None:
        return
    with chromium() as browser, dashboard("-n", TENANT, "--prometheus", prometheus_url(cluster),
                                          cwd=cluster.root, env=cluster.env) as url:  # fmt: skip
        page = browser.new_page()
        row = poll_until(lambda: serving_row(page, url, NAME), what="the serving page's latency",
                         timeout=60, interval=2)  # fmt: skip
        cells = row.locator("td").all_inner_texts()
        assert cells[3] == "2/2" and float(row.locator(".rps").inner_text()) > 0, cells
        screenshot(page, "serving-load")


def test_the_example_scales_out_under_loadgen_and_back_in_after(
    reallab: DevCluster, service: None
) -> None:
    (metric,) = hpa(reallab)["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == ADAPTER_METRICS["queueTime"]
    (first,) = poll_until(lambda: ready_pods(reallab, NAME), what="one replica", timeout=300,
                          interval=2)  # fmt: skip
    poll_until(lambda: metric_served(reallab), what="the HPA's metric", timeout=120, interval=2)
    started = start_load(reallab)
    pods = awaited(reallab, lambda: two_ready(reallab), "a second replica ready under load", 300)
    (second,) = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
    name, ready = second["metadata"]["name"], ready_since(second)
    scaled_out = ready - started
    created = epoch(second["metadata"]["creationTimestamp"])
    # its share of the load, once ready; none before (every sample up to Ready is 0)
    poll_until(
        lambda: any(
            float(r["value"][1]) > 0 for r in prometheus(reallab, "query", query=requests_of(name))
        ),
        what=f"{name} answering",
        timeout=120,
    )
    before = prometheus(reallab, "query_range", query=requests_of(name), start=created,
                        end=ready, step=1)  # fmt: skip
    assert all(float(v) == 0 for r in before for _, v in r["values"]), before
    # a whole run with both replicas in the Service from its start: none of its requests fails
    # (a run is 10 s of load, but the load pod's CLI starts in a CPU-limited container: in the
    # full suite beside other real-node tests two runs took over 120 s)
    runs = awaited(reallab, lambda: runs_since(reallab, ready + 1),
                   "a LoadGen run on two replicas", 300)  # fmt: skip
    # the dashboard's serving page: both replicas, the load's requests and their latency
    the_page_shows_the_load(reallab)
    stop_load(reallab)
    stopped = time.time()
    assert runs and all(r["errors"] == 0 for r in runs), runs
    poll_until(lambda: len(reallab.pods(TENANT, NAME)) == 1 and hpa(reallab)["status"].get(
        "desiredReplicas") == 1, what="back to one replica", timeout=300, interval=2)  # fmt: skip
    scaled_in = time.time() - stopped
    assert scaled_in >= SCALE_DOWN_DELAY
    record("autoscaling", load_to_second_ready_s=scaled_out, load_end_to_one_replica_s=scaled_in,
           runs=len(runs))  # fmt: skip
