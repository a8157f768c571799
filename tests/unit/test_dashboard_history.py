"""The dashboard's history: a finished job's page from what is kept beside its checkpoints
(checkpoints verified, the ranks' kept logs giving the curves and the pods that ran), found in a
job's checkpoint directory or a directory of them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.history import entries, history_page
from tests.support.checkpoints import JOB, commit
from tests.support.runs import step_lines

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
