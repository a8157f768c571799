"""The dashboard's serving page: each InferenceService as rendered (its Triton Deployment and
HorizontalPodAutoscaler, or KEDA's ScaledObject), with the state the controllers report: ready
replicas, the autoscaler's bounds, desired replicas, its metric against the target, and why it
cannot scale further."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.servingpage import service_rows
from gpufleet.dashboard.sources import ClusterSource
from gpufleet.dashboard.utilization import PodTraffic, Traffic
from gpufleet.kube import LABEL_JOB, LABEL_ROLE, ROLE_SERVER
from gpufleet.net import free_port
from gpufleet.render import render_spec
from tests.support.fake_kube import FakeKube
from tests.support.serving import parsed, service

HPA = {"resources": {"gpu": 1}, "replicas": {"min": 1, "max": 3},
       "autoscaling": {"metric": "inflight", "targetInflight": 4}}  # fmt: skip
KEDA = {"replicas": {"min": 1, "max": 8}, "autoscaling": {"engine": "keda"}}


def rendered(name: str, ns: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    doc = service(**spec)
    doc["metadata"] = {"name": name, "namespace": ns}
    return render_spec(parsed(doc), "triton")


def at_its_max(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``objects`` as the controllers leave them: 3 replicas wanted, 2 ready; the HPA at its
    maximum with 9 requests in flight a pod against a target of 4."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "Deployment":
            obj["spec"]["replicas"], obj["status"] = 3, {"readyReplicas": 2, "replicas": 3}
        if obj["kind"] == "HorizontalPodAutoscaler":
            metric = obj["spec"]["metrics"][0]["pods"]["metric"]
            obj["status"] = {"currentReplicas": 3, "desiredReplicas": 3, "currentMetrics": [
                {"type": "Pods", "pods": {"metric": metric, "current": {"averageValue": "9"}}}],
                "conditions": [
                    {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
                    {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas",
                     "message": "the desired replica count is more than the maximum"}]}  # fmt: skip
    return out


def test_a_service_at_its_autoscalers_maximum_says_so() -> None:
    objects = at_its_max(rendered("digits", "team-a", HPA))
    by_kind = {o["kind"]: o for o in objects}
    (row,) = service_rows([by_kind["Deployment"]], [], [by_kind["HorizontalPodAutoscaler"]], [])
    assert (row.phase, row.ready, row.replicas) == ("Degraded", 2, 3)
    a = row.autoscaler
    assert a is not None and (a.min, a.max, a.current, a.desired) == (1, 3, 3, 3)
    assert a.metric.endswith(": 9 / 4") and a.notes == [
        "ScalingLimited: TooManyReplicas: the desired replica count is more than the maximum"
    ]


def test_a_metric_in_milli_units_reads_as_a_plain_number() -> None:
    """The adapter's queue time per request is seconds, which the HPA writes ``59m``."""
    objects = at_its_max(rendered("digits", "team-a", HPA))
    (hpa,) = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "20m"
    hpa["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"] = "59m"
    (row,) = service_rows([o for o in objects if o["kind"] == "Deployment"], [], [hpa], [])
    assert row.autoscaler is not None and row.autoscaler.metric.endswith(": 0.059 / 0.02")
    del hpa["status"]["currentMetrics"]  # not read yet
    (row,) = service_rows([o for o in objects if o["kind"] == "Deployment"], [], [hpa], [])
    assert row.autoscaler is not None and row.autoscaler.metric.endswith(": ? / 0.02")


def test_the_serving_page_lists_each_service_with_its_autoscaler(tmp_path: Path) -> None:
    kube = FakeKube()
    for obj in at_its_max(rendered("digits", "team-a", HPA)) + rendered("keda", "team-b", KEDA):
        kube.put(obj)
    app = TestClient(create_app(tmp_path, ClusterSource(kube.cluster("team-a"))),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    page = app.get("/serving").text
    hpa = page.split('data-name="team-a/digits"')[1].split("</tr>")[0]
    assert "HorizontalPodAutoscaler" in hpa and "TooManyReplicas" in hpa and "2/3" in hpa
    keda = page.split('data-name="team-b/keda"')[1].split("</tr>")[0]
    assert "ScaledObject" in keda and ">8<" in keda


def server_pod(name: str, ns: str, service: str) -> dict[str, Any]:
    labels = {LABEL_JOB: service, LABEL_ROLE: ROLE_SERVER}
    return {"apiVersion": "v1", "kind": "Pod", "spec": {}, "status": {"phase": "Running"},
            "metadata": {"name": name, "namespace": ns, "labels": labels}}  # fmt: skip


def test_a_services_traffic_is_its_own_pods_summed() -> None:
    """Requests add up over the service's pods, and so do the seconds they took: the mean
    latency is the total time over the total requests, not a mean of the pods' means."""
    by_kind = {o["kind"]: o for o in rendered("digits", "team-a", HPA)}
    pods = [server_pod("digits-a", "team-a", "digits"), server_pod("digits-b", "team-a", "digits"),
            server_pod("other-a", "team-a", "other")]  # fmt: skip
    seen = PodTraffic({("team-a", "digits-a"): Traffic(30.0, 0.3, 0.03),
                       ("team-a", "digits-b"): Traffic(10.0, 0.5, 0.01),
                       ("team-a", "other-a"): Traffic(99.0, 9.0, 9.0)})  # fmt: skip
    (row,) = service_rows([by_kind["Deployment"]], pods, [], [], seen)
    assert row.traffic is not None and row.traffic.requests == 40.0
    assert row.traffic.latency_ms == pytest.approx(20.0)  # 0.8 s a second over 40 requests
    assert row.traffic.queue_ms == pytest.approx(1.0)
    idle = PodTraffic({("team-a", "digits-a"): Traffic()})  # scraped, no request this minute
    (quiet,) = service_rows([by_kind["Deployment"]], pods, [], [], idle)
    assert quiet.traffic is not None and quiet.traffic.latency_ms is None
    for unknown in (None, PodTraffic(), PodTraffic(seen.pods, error="Prometheus at x: refused")):
        (row,) = service_rows([by_kind["Deployment"]], pods, [], [], unknown)
        assert row.traffic is None


def test_the_serving_page_says_when_prometheus_does_not_answer(tmp_path: Path) -> None:
    kube = FakeKube()
    for obj in rendered("digits", "team-a", HPA):
        kube.put(obj)
    source = ClusterSource(kube.cluster("team-a"), prometheus=f"http://127.0.0.1:{free_port()}")
    app = TestClient(create_app(tmp_path, source), base_url="http://127.0.0.1:8465")
    page = app.get("/serving").text
    assert 'id="traffic-error"' in page and "Prometheus at http://127.0.0.1:" in page
    row = page.split('data-name="team-a/digits"')[1].split("</tr>")[0]
    assert '<td class="num latency">-</td>' in row
