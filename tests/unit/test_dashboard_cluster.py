"""`gpufleet dashboard` over a cluster, in process: the recorded scenarios' jobs on the jobs
page (filtered by name and phase), and a job's page: its reasons, pods by rank, its timeline
in time order and its pods' logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.sources import ClusterSource
from gpufleet.kube import ANNOTATION_NODE_RANGE, ANNOTATION_RESIZES, METRICS_PORT_NAME
from tests.support.scenarios import kube_of
from tests.unit.test_fleet_jobs import NOW, SCENARIOS, fleet_kube
from tests.unit.test_job_progress import pod_text


def client(tmp_path: Path) -> TestClient:
    app = create_app(tmp_path, ClusterSource(fleet_kube().cluster("team-a")))
    return TestClient(app, base_url="http://127.0.0.1:8465")


def test_the_jobs_page_lists_every_job_and_filters(tmp_path: Path) -> None:
    app = client(tmp_path)
    assert app.get("/", follow_redirects=False).headers["location"] == "/jobs"
    page = app.get("/jobs").text
    assert all('data-name="team-' in page and f">{name}</a>" in page for name in SCENARIOS)
    assert f"{len(SCENARIOS)} of {len(SCENARIOS)} jobs" in page
    queued = app.get("/jobs", params={"phase": "Queued"}).text
    assert ">kueue-quota</a>" in queued and ">running</a>" not in queued
    assert "Kueue: waiting in LocalQueue team-a" in queued
    named = app.get("/jobs", params={"q": "team-b/run"}).text
    assert "1 of" in named and ">running</a>" in named


def test_a_jobs_page_shows_its_reasons_pods_timeline_and_logs(tmp_path: Path) -> None:
    app = client(tmp_path)
    waiting = app.get("/jobs/team-a/kueue-quota").text
    assert "Kueue: waiting in LocalQueue team-a" in waiting and 'id="no-pods"' in waiting
    assert "QuotaReserved=False" in waiting  # the Workload's condition in the timeline
    failed = app.get("/jobs/team-a/failed").text
    assert 'data-pod="failed-0-zzz1"' in failed and "1 Error" in failed
    assert "failed-0-zzz1 line 4" in failed  # its log, though it ended
    timeline = app.get("/jobs/team-a/unschedulable").text.split('id="timeline"')[1]
    times = [row.split("</td>")[0] for row in timeline.split("<tr><td>")[1:]]
    assert len(times) >= 2 and times == sorted(times)
    assert "FailedScheduling" in timeline
    assert app.get("/jobs/team-a/nope").status_code == 404


def test_the_queues_page_shows_quota_and_the_waiting_in_order(tmp_path: Path) -> None:
    page = client(tmp_path).get("/queues").text
    assert 'class="cluster-queue" data-name="team-a"' in page
    assert 'data-resource="a30/nvidia.com/gpu"' in page
    waiting = page.split('id="waiting"')[1]
    assert 'data-name="team-a/kueue-quota"' in waiting and "insufficient unused quota" in waiting


def test_a_refusal_of_the_cluster_is_one_line_on_the_page(tmp_path: Path) -> None:
    kube = fleet_kube()
    app = TestClient(create_app(tmp_path, ClusterSource(kube.cluster("team-a"))),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    kube.fail_with = 403
    page = app.get("/jobs")
    assert page.status_code == 403 and "Traceback" not in page.text
    assert "forbidden (RBAC)" in page.text and "User &#34;bob&#34; cannot list" in page.text


@pytest.mark.parametrize(("progress_s", "reads"), [(0.0, 2), (60.0, 1)])
def test_a_running_jobs_progress_is_read_once_per_refresh_for_every_viewer(
    progress_s: float, reads: int
) -> None:
    """The dashboard's source keeps a pod's metrics ``progress_s`` (the refresh interval): two
    viewers' pages within it cost one read through the API server's proxy, not two."""
    kube = kube_of("running")
    for pod in kube.pods():
        port = {"name": METRICS_PORT_NAME, "containerPort": 9090}
        pod["spec"] = {"containers": [{"name": "worker", "ports": [port]}]}
        kube.metrics[pod["metadata"]["name"]] = pod_text(0, 40, total=100, checkpoint=30)
    source = ClusterSource(kube.cluster("team-a"), progress_s=progress_s)
    for _ in range(2):
        (row,) = source.rows(NOW)
        assert (row.step, row.steps) == (40, 100)
    proxied = kube.called("connect_get_namespaced_pod_proxy_with_path")
    assert len(proxied) == reads * len(kube.pods())


def test_an_elastic_jobs_page_shows_its_size_and_its_resizes(tmp_path: Path) -> None:
    """The size in its node range beside the phase; each resize, with its cause, in the
    timeline at its time (gpufleet.cluster.elastic records them on the Job)."""
    kube = kube_of("unschedulable")
    (job,) = [o for o in kube.objects.values() if o["kind"] == "Job"]
    resize = {
        "from": 1,
        "to": 2,
        "cause": "quota freed in cohort lab",
        "at": "2020-01-01T00:00:00Z",
    }
    job["metadata"]["annotations"] = {ANNOTATION_NODE_RANGE: "1:2",
                                      ANNOTATION_RESIZES: json.dumps([resize])}  # fmt: skip
    job["spec"]["parallelism"] = 2
    app = TestClient(create_app(tmp_path, ClusterSource(kube.cluster("team-a"))),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    page = app.get("/jobs/team-a/digits").text
    assert '<span id="size">size 2 of 1–2 nodes</span>' in page
    timeline = page.split('id="timeline"')[1]
    (row,) = [r for r in timeline.split("<tr><td>")[1:] if "Resized" in r]
    assert row.startswith("2020-01-01T00:00:00Z") and "grew 1→2 at 00:00:00Z" in row, row
