"""`gpufleet dashboard --auth token`, in process: signing in, refused and missing tokens, and
each viewer seeing only what its user may read (the reviews' stand-in: tests/support/
fake_reviews.py; the API server's own: tests/cluster/test_devcluster_queues_fleet.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.main import app as cli
from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.auth import ACCEPTED_S, REFUSED_S, TOKEN_COOKIE, Reviews
from gpufleet.dashboard.sources import ClusterSource
from tests.support.fake_reviews import FakeReviews, Grant
from tests.unit.test_dashboard_fleet import node, pod
from tests.unit.test_fleet_jobs import fleet_kube

BASE = "http://127.0.0.1:8465"
TENANT = [Grant("group:team-a", "list", "pods", "team-a"),
          Grant("group:team-a", "get", "pods/log", "team-a")]  # fmt: skip
ADMIN = [Grant("admin", "list", "pods"), Grant("admin", "get", "pods/log"),
         Grant("admin", "list", "nodes"),
         Grant("admin", "list", "clusterqueues", group="kueue.x-k8s.io")]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def board(tmp_path: Path) -> tuple[TestClient, FakeReviews, Clock]:
    kube = fleet_kube()
    for obj in (node("h1", "NVIDIA-H100-80GB-HBM3", 8), pod("a0", "team-a", "h1", 2),
                pod("b0", "team-b", "h1", 4)):  # fmt: skip
        kube.put(obj)
    fake = FakeReviews(tokens={"dana-token": ("dana", ["team-a"]), "root-token": ("admin", [])},
                       grants=TENANT + ADMIN)  # fmt: skip
    clock = Clock()
    reviews = Reviews(fake, fake, clock)
    app = create_app(tmp_path, ClusterSource(kube.cluster("default")), reviews=reviews)
    return TestClient(app, base_url=BASE), fake, clock


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_a_token_every_page_is_the_login_page(board: tuple[TestClient, ...]) -> None:
    client = board[0]
    for path in ("/", "/jobs", "/jobs/team-a/failed", "/queues", "/fleet", "/serving", "/runs",
                 "/history"):  # fmt: skip
        got = client.get(path, follow_redirects=False)
        assert got.status_code == 303 and "/login?next=" in got.headers["location"], path
        assert "team-" not in got.text
    assert client.get("/healthz").text == "ok\n" and client.get("/static/dashboard.js").is_success
    assert 'name="token"' in client.get("/login").text


def test_a_refused_token_is_401_or_the_login_page_again(board: tuple[TestClient, ...]) -> None:
    client = board[0]
    header = client.get("/jobs", headers=bearer("forged"), follow_redirects=False)
    assert header.status_code == 401 and header.headers["www-authenticate"] == "Bearer"
    assert "not accepted" in header.text and "team-" not in header.text
    client.cookies.set(TOKEN_COOKIE, "expired")
    cookie = client.get("/jobs", follow_redirects=False)
    assert cookie.status_code == 303 and cookie.headers["location"] == "/login?refused=1"
    assert f'{TOKEN_COOKIE}=""' in cookie.headers["set-cookie"]  # dropped
    assert "not accepted" in client.get("/login?refused=1").text


def test_signing_in_keeps_the_token_in_a_strict_httponly_cookie(
    board: tuple[TestClient, ...],
) -> None:
    client = board[0]
    wrong = client.post("/login", data={"token": "forged", "next": "/queues"})
    assert wrong.status_code == 401 and 'id="refused"' in wrong.text
    signed = client.post("/login", data={"token": "dana-token", "next": f"{BASE}/queues?x=1"},
                         follow_redirects=False)  # fmt: skip
    assert signed.status_code == 303 and signed.headers["location"] == "/queues?x=1"
    cookie = signed.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    page = client.get("/jobs")
    assert page.status_code == 200 and 'id="viewer">dana' in page.text
    assert client.get("/logout", follow_redirects=False).headers["location"] == "/login"


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "jobs"])
def test_after_signing_in_only_this_dashboards_pages(
    board: tuple[TestClient, ...], target: str
) -> None:
    signed = board[0].post("/login", data={"token": "dana-token", "next": target},
                           follow_redirects=False)  # fmt: skip
    assert signed.headers["location"] == "/"


def test_a_sign_in_posted_from_another_site_is_refused(board: tuple[TestClient, ...]) -> None:
    client = board[0]
    forged = client.post("/login", data={"token": "dana-token"},
                         headers={"Origin": "https://evil.example"})  # fmt: skip
    assert forged.status_code == 403 and "set-cookie" not in forged.headers
    huge = client.post("/login", content=b"token=" + b"x" * 70_000,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert huge.status_code == 413


def test_a_tenants_user_sees_only_its_namespace(board: tuple[TestClient, ...]) -> None:
    client, dana = board[0], bearer("dana-token")
    jobs = client.get("/jobs", headers=dana).text
    assert 'data-name="team-a/failed"' in jobs and "team-b" not in jobs
    assert "4 of 4 jobs" in jobs  # nor are the other tenant's counted
    theirs = client.get("/jobs/team-b/running", headers=dana)
    assert (
        theirs.status_code == 404
        and "no gpufleet job &#39;running&#39; in namespace team-b" in theirs.text
    )
    mine = client.get("/jobs/team-a/failed", headers=dana).text
    assert "failed-0-zzz1 line 4" in mine  # its log
    queues = client.get("/queues", headers=dana).text
    assert 'id="unreadable"' in queues and "team-b" not in queues
    assert 'data-name="team-a/kueue-quota"' in queues
    fleet = client.get("/fleet", headers=dana).text
    assert 'data-tenant="team-a/NVIDIA-H100-80GB-HBM3"' in fleet and "team-b" not in fleet
    assert 'id="no-nodes"' in fleet and 'data-node="h1"' not in fleet
    assert 'href="/runs"' not in jobs and 'href="/history"' not in jobs  # not offered either
    for hidden in ("/runs", "/history"):
        page = client.get(hidden, headers=dana)
        assert page.status_code == 404 and "may list pods in every namespace" in page.text


def test_the_admin_sees_every_namespace_and_the_nodes(board: tuple[TestClient, ...]) -> None:
    client, root = board[0], bearer("root-token")
    jobs = client.get("/jobs", headers=root).text
    assert "team-a/failed" in jobs and "team-b/running" in jobs
    fleet = client.get("/fleet", headers=root).text
    assert 'data-node="h1"' in fleet and 'data-tenant="team-b/NVIDIA-H100-80GB-HBM3"' in fleet
    assert 'class="cluster-queue"' in client.get("/queues", headers=root).text
    assert client.get("/runs", headers=root).status_code == 200 and 'href="/history"' in jobs


def test_logs_and_curves_need_the_right_to_read_logs(board: tuple[TestClient, ...]) -> None:
    client, fake = board[0], board[1]
    fake.tokens["lee-token"] = ("lee", ["auditors"])
    fake.grants.append(Grant("group:auditors", "list", "pods", "team-a"))
    page = client.get("/jobs/team-a/failed", headers=bearer("lee-token")).text
    assert "failed-0-zzz1 line 4" not in page and "may read this namespace's pod logs" in page


def test_reviews_are_kept_a_while_and_asked_again_after(board: tuple[TestClient, ...]) -> None:
    client, fake, clock = board
    for _ in range(3):
        client.get("/jobs", headers=bearer("dana-token"))
    assert fake.calls.count("token") == 1  # the refreshes cost the API server nothing
    asked = len(fake.calls)
    client.get("/jobs", headers=bearer("dana-token"))
    assert len(fake.calls) == asked
    del fake.tokens["dana-token"]  # revoked
    clock.now += ACCEPTED_S + 1
    assert client.get("/jobs", headers=bearer("dana-token")).status_code == 401
    client.get("/jobs", headers=bearer("dana-token"))
    assert fake.calls.count("token") == 2  # a refusal is kept too, for a shorter while
    clock.now += REFUSED_S + 1
    client.get("/jobs", headers=bearer("dana-token"))
    assert fake.calls.count("token") == 3


def test_an_api_server_that_does_not_answer_is_503(board: tuple[TestClient, ...]) -> None:
    client, fake = board[0], board[1]
    fake.down = True
    got = client.get("/jobs", headers=bearer("dana-token"))
    assert got.status_code == 503 and "cannot check the token" in got.text


def test_the_command_refuses_an_open_address_without_tokens(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path), "COLUMNS": "200"}
    open_ = CliRunner().invoke(cli, ["dashboard", "--local", "--address", "0.0.0.0"], env=env)
    assert open_.exit_code == 2
    assert "--address: 0.0.0.0 serves anyone who reaches it: only with --auth token" in open_.stderr
    local = CliRunner().invoke(cli, ["dashboard", "--local", "--auth", "token"], env=env)
    assert local.exit_code == 2 and "--auth: token needs a cluster" in local.stderr
