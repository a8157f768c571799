"""The dashboard's history: a finished job's page from what is kept beside its checkpoints
(checkpoints verified, the ranks' kept logs giving the curves and the pods that ran), found in a
job's checkpoint directory or a directory of them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.history import entries, history_page
from gpufleet.dashboard.sources import ClusterSource
from gpufleet.render import render
from gpufleet.runtime.context import ENV_CHECKPOINT_DIR
from gpufleet.spec import validate_training_job
from tests.support.checkpoints import JOB, commit
from tests.support.fake_kube import FakeKube
from tests.support.runs import step_lines
from tests.support.specs import digits_job

POD_LOG = "logs/{pod}/digits-1a2b_x/attempt_{attempt}/{rank}/stdout.log"


def kept_job(root: Path) -> Path:
    """A job that ran on two pods, the second one replacing the first after step 60: three
    checkpoints, and every rank's kept log (rank 0's with its step lines)."""
    for step in (40, 80, 100):
        commit(str(root), step)
    pods = {"20261120T100000.000Z-digits-0-a": step_lines(20, 40, 60),
            "20261120T101500.000Z-digits-0-b": step_lines(40, 60, 80, 100)}  # fmt: skip
    for pod, text in pods.items():
        for rank, lines in (("0", text), ("1", "")):
            log = root / POD_LOG.format(pod=pod, attempt=0, rank=rank)
            log.parent.mkdir(parents=True)
            log.write_text(lines)
    return root


def test_a_directory_of_jobs_lists_each_one(tmp_path: Path) -> None:
    kept_job(tmp_path / "ckpt" / "digits")
    (tmp_path / "ckpt" / "notes").mkdir()  # neither checkpoints nor kept logs: not a job
    (only,), problems = entries([str(tmp_path / "ckpt")])
    assert problems == []
    assert (only.job, only.steps) == (JOB, [40, 80, 100])
    assert [p.name[-10:] for p in only.pods] == ["digits-0-a", "digits-0-b"]  # in time order
    assert entries([str(tmp_path / "ckpt" / "digits")])[0][0].location.endswith("digits")
    assert "nosuch://x: ValueError" in entries(["nosuch://x"])[1][0]  # one line, no traceback


def test_a_past_jobs_page_has_its_curves_checkpoints_and_pods(tmp_path: Path) -> None:
    root = kept_job(tmp_path / "digits")
    page = history_page(str(root))
    assert page.curves.points("loss")[-1] == (100, 0.01) and page.curves.restarts == [40]
    assert [c.status for c in page.checkpoints] == ["OK", "OK", "OK"]
    app = TestClient(create_app(tmp_path / "runs", history_at=(str(tmp_path),)),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    listed = app.get("/history").text
    assert f'data-job="{JOB}"' in listed
    at = listed.split('href="/history/job?at=')[1].split('"')[0]
    assert unquote(at) == str(root)  # the directory itself names the page: a stable link
    at = f"/history/job?at={at}"
    shown = app.get(at).text
    assert "data-refresh" not in shown  # it verifies every checkpoint: not every 5 s
    loss = shown[shown.index('<g id="loss-points"') :]
    assert loss[: loss.index("</g>")].count("<use ") == 5
    assert "2 pods kept their ranks' logs over 2 tries" in shown
    outside = app.get("/history/job", params={"at": str(tmp_path / "runs")})
    assert outside.status_code == 404  # only a directory the locations hold is read


def test_without_a_location_the_page_says_how_to_give_one(tmp_path: Path) -> None:
    app = TestClient(create_app(tmp_path), base_url="http://127.0.0.1:8465")
    assert "gpufleet dashboard --history" in app.get("/history").text


def ended_job(kube: FakeKube, location: str) -> None:
    """A rendered Job that keeps its checkpoints at ``location``, Complete, its pods gone."""
    doc = digits_job("kept", image="ghcr.io/example/gpufleet:0.1.0",
                     checkpoint={"dir": "s3://bucket/ckpt/kept", "everySteps": 20})  # fmt: skip
    doc["metadata"]["namespace"] = "team-a"
    for obj in render(validate_training_job(doc), "job"):
        if obj["kind"] == "Job":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env") or []:
                    if env["name"] == ENV_CHECKPOINT_DIR:
                        env["value"] = location  # the object store, here a directory URI
            obj["status"] = {"succeeded": 1,
                             "conditions": [{"type": "Complete", "status": "True"}]}  # fmt: skip
        kube.put(obj)


def test_a_cluster_jobs_page_shows_its_checkpoints_and_kept_curves_once_ended(
    tmp_path: Path,
) -> None:
    """Its pods are gone: the checkpoints, verified, and the curves from the kept logs."""
    kube = FakeKube()
    ended_job(kube, f"file://{kept_job(tmp_path / 'ckpt' / 'kept')}")
    source = ClusterSource(kube.cluster("team-a"))
    app = TestClient(create_app(tmp_path, source, history_at=(f"file://{tmp_path / 'ckpt'}",)),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    page = app.get("/jobs/team-a/kept").text
    assert page.count('class="status-OK"') == 3 and 'id="loss"' in page
    assert f"file://{tmp_path / 'ckpt' / 'kept'}" in page
    elsewhere = TestClient(create_app(tmp_path, source), base_url="http://127.0.0.1:8465")
    page = elsewhere.get("/jobs/team-a/kept").text  # the dashboard was not told to read there
    assert "not under the dashboard&#39;s --history locations" in page
    assert 'id="checkpoints"' not in page


def test_a_cluster_jobs_checkpoints_on_its_volume_are_named_not_read(tmp_path: Path) -> None:
    kube = FakeKube()
    ended_job(kube, "/ckpt/kept")
    app = TestClient(create_app(tmp_path, ClusterSource(kube.cluster("team-a"))),
                     base_url="http://127.0.0.1:8465")  # fmt: skip
    page = app.get("/jobs/team-a/kept").text
    assert "which the dashboard does not mount" in page and 'id="checkpoints"' not in page
