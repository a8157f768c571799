"""`gpufleet jobs` and `gpufleet queues` on the real controllers (issue 53, item 1; named to run
right after test_devcluster_queues, the lab's first user: test_devcluster_platform installs
the chart itself, and must run before the lab is installed): the lab's
two tenants run and queue jobs; the admin sees every job with what `status` says of it, a
tenant's user only its own namespace's, and Kueue's quota and order as Kueue holds them; the
dashboard's jobs pages show the same in Chromium (item 5).

On the session's local cluster with the chart's lab (tests/support/devlab.py: tenants research
and product in cohort "lab", 3 nodes x 4 A30; research 6 GPUs nominal, 2 more borrowable).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator

import httpx2 as httpx  # what the dev extra installs (Starlette's test client uses it)
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpufleet.devcluster.kwok import RUN_FOR_A_DAY
from gpufleet.errors import UserInputError
from tests.cluster.test_devcluster_queues import submit_annotated
from tests.support.accounts import account_token, drop_viewer, token_env, viewer_token
from tests.support.browser import chromium, dashboard, needs_browser, screenshot
from tests.support.devcluster import (
    CHART,
    CLUSTER_POLL_S,
    DevCluster,
    condition,
    needs_controlplane,
    tenant_user,
    workload_of,
)
from tests.support.devlab import queued_job, tenant_leftovers
from tests.support.procs import poll_until
from tests.support.serving import parsed, service

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
# Names of their own: test_devcluster_queues's "holder" and "waiter", cancelled just before,
# may still be being deleted (a create of the same name is refused: AlreadyExists).
JOBS = {"holds": ("research", 1, 4, "job"), "waits": ("research", 2, 3, "jobset"),
        "other": ("product", 1, 1, "job")}  # fmt: skip


@pytest.fixture(scope="module")
def fleet(lab: DevCluster) -> Iterator[DevCluster]:
    """research runs a 1 x 4 GPU job and queues a 2 x 3 gang (4 + 6 > its 8); product runs a
    1 x 1 job and serves a model on CPUs, autoscaled by an HPA. Every pod runs until
    cancelled."""
    from gpufleet.cluster.client import Cluster
    from gpufleet.render import render_spec

    # An earlier module's cancelled jobs' workloads and pods, while they are being deleted,
    # still count in Kueue's usage and in the GPUs the fleet page shows each tenant holding.
    try:
        poll_until(lambda: not tenant_leftovers(lab), what="no workload or pod left", timeout=90)
    except pytest.fail.Exception:
        pytest.fail(f"left from earlier modules after 90 s: {tenant_leftovers(lab)}")
    try:
        for name, (ns, nodes, gpus, target) in JOBS.items():  # the 4-GPU job first, Running
            submit_annotated(lab, queued_job(name, ns, nodes=nodes, gpus=gpus), target,
                             RUN_FOR_A_DAY)  # fmt: skip
            if name == "holds":  # else Kueue may admit the gang first, and hold this one
                poll_until(lambda: lab.phase("holds", "research") == "Running",
                           what="holds Running",
                           timeout=60, interval=CLUSTER_POLL_S)  # fmt: skip
        served = service(replicas={"min": 1, "max": 2},
                         autoscaling={"metric": "inflight", "targetInflight": 4})  # fmt: skip
        served["metadata"] = {"name": "served", "namespace": "product"}
        Cluster.of(lab.api, "product").submit(render_spec(parsed(served), "triton"))
        poll_until(lambda: lab.phase("other", "product") == "Running", what="other Running",
                   timeout=60, interval=CLUSTER_POLL_S)  # fmt: skip
        poll_until(lambda: "insufficient" in str((next(
            (c for c in ((workload_of(lab, "research", "waits") or {}).get("status") or {})
             .get("conditions", []) if c["type"] == "QuotaReserved"), {})).get("message")),
            what="Kueue to refuse the gang for quota", timeout=60)  # fmt: skip
        yield lab
    finally:
        for name, ns in [(n, j[0]) for n, j in JOBS.items()] + [("served", "product")]:
            with contextlib.suppress(UserInputError):  # not made: the set-up failed before
                lab.cancel(name, ns)


def test_the_admin_sees_every_job_saying_what_status_says(fleet: DevCluster) -> None:
    from gpufleet.cluster.client import Cluster
    from gpufleet.cluster.fleet import read_visible
    from gpufleet.cluster.jobrows import row_of

    found, note = read_visible(fleet.custom, fleet.core, "default", all_namespaces=True)
    now = dt.datetime.now(dt.UTC)
    rows = {r.name: r for r in (row_of(found, k, j, now) for k, j in found.jobs)}
    assert note is None and set(JOBS) <= set(rows), rows  # a JobSet's child Jobs are no rows
    for name, (ns, _, _, target) in JOBS.items():
        row = rows[name]
        status = Cluster.of(fleet.api, ns).status(name)
        assert (row.namespace, row.target, row.queue) == (ns, target, ns)
        assert (row.phase, row.reason) == (status.phase, status.reasons[0] if
                                           status.phase == "Queued" else None)  # fmt: skip
        assert row.age_seconds is not None and 0 <= row.age_seconds < 600
    assert rows["waits"].phase == "Queued" and rows["holds"].phase == "Running"
    assert "ClusterQueue research" in str(rows["waits"].reason)
    text = fleet.gpufleet_as(fleet.env | {"COLUMNS": "80"}, "jobs", "-A")  # a terminal's width
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), text.stdout
    assert any(line.split()[:2] == ["research", "waits"] for line in lines), text.stdout
    waiting = " ".join(lines[lines.index("Waiting:") :])
    assert "research/waits: Kueue: waiting in LocalQueue research" in waiting, text.stdout


def test_a_tenants_user_sees_only_its_namespace(fleet: DevCluster) -> None:
    env = tenant_user(fleet, "dana", "research")
    mine = fleet.gpufleet_as(env, "jobs", "-A", "-n", "research", "-o", "json")
    assert mine.returncode == 0, mine.stderr
    assert "may not list across namespaces (forbidden): namespace research only" in mine.stderr
    rows = json.loads(mine.stdout)["jobs"]
    assert {"holds", "waits"} <= {r["name"] for r in rows}
    assert {r["namespace"] for r in rows} == {"research"}  # product's job is not there
    theirs = fleet.gpufleet_as(env, "jobs", "-n", "product")
    assert theirs.returncode == 1 and len(theirs.stderr.strip().splitlines()) == 1
    assert "forbidden" in theirs.stderr and "other" not in theirs.stdout


def test_queues_show_kueues_quota_and_the_callers_place_in_line(fleet: DevCluster) -> None:
    env = tenant_user(fleet, "dana", "research")
    shown = fleet.gpufleet_as(env, "queues", "-n", "research", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    cqs = {q["name"]: q for q in data["clusterQueues"]}
    assert set(cqs) >= {"research", "product"}  # the chart lets tenants read every queue
    gpu = next(f for f in cqs["research"]["quota"] if f["resource"] == "nvidia.com/gpu")
    assert (gpu["nominal"], gpu["used"], gpu["borrowed"], gpu["lendable"]) == ("6", "4", "0", "2")
    assert cqs["research"]["pending"] == 1 and cqs["research"]["cohort"] == "lab"
    (waiting,) = data["waiting"]
    assert (waiting["job"], waiting["position"], waiting["of"], waiting["exact"]) == (
        "waits", 1, 1, True)  # fmt: skip
    assert "insufficient" in waiting["reason"]
    assert [q["namespace"] for q in data["localQueues"]] == ["research"]
    text = fleet.gpufleet_as(fleet.env | {"COLUMNS": "80"}, "queues", "-A")
    assert text.returncode == 0, text.stderr
    assert all(len(line.rstrip()) <= 80 for line in text.stdout.splitlines()), text.stdout
    assert "ClusterQueue research (cohort lab): 1 pending" in text.stdout
    assert not condition(workload_of(fleet, "research", "waits"), "QuotaReserved")


@needs_browser
def test_the_dashboards_jobs_and_queues_in_a_browser(fleet: DevCluster) -> None:
    """The admin's dashboard in Chromium: every job, the waiting one's reason, the phase filter
    (the page's own form), a waiting job's page with Kueue's reason and its Workload's
    condition, the queues page (research's GPUs in use, the gang first in line), the fleet
    page (the GPUs each tenant holds) and the serving page (the service's autoscaler)."""
    with chromium() as browser, dashboard("--run-root", str(fleet.root / "runs"), "--refresh",
                                          "1", cwd=fleet.root, env=fleet.env) as url:  # fmt: skip
        page = browser.new_page()
        page.goto(url)  # the jobs page, for a cluster
        waiter = page.locator('#jobs tr[data-name="research/waits"]')
        assert waiter.locator(".phase-Queued").inner_text() == "Queued"
        assert "Kueue: waiting in LocalQueue research" in waiter.locator(".reason").inner_text()
        assert page.locator('#jobs tr[data-name="product/other"] .phase-Running').count() == 1
        screenshot(page, "jobs")
        page.select_option("select[name=phase]", "Queued")
        page.click("form button")
        page.wait_for_url("**/jobs?*phase=Queued*")
        names = page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.name)")
        assert names == ["research/waits"]
        page.click('a[href="/jobs/research/waits"]')
        page.wait_for_url("**/jobs/research/waits")
        assert page.locator("#status .phase-Queued").inner_text() == "Queued"
        assert "insufficient" in page.locator("#reasons").inner_text()
        assert "QuotaReserved=False" in page.locator("#timeline").inner_text()
        screenshot(page, "job-waiting")
        page.click("header a[href='/queues']")
        page.wait_for_url("**/queues")
        gpus = page.locator('[data-name="research"] tr[data-resource="a30/nvidia.com/gpu"] td')
        gpus.first.wait_for()
        assert gpus.all_inner_texts()[2:6] == ["6", "4", "0", "2"]  # nominal used borrowed lendable
        page.locator('#waiting tr[data-name="research/waits"]').wait_for()
        line = page.locator('#waiting tr[data-name="research/waits"] td').all_inner_texts()
        assert line[0] == "1 of 1" and "insufficient" in line[-1]
        screenshot(page, "queues")
        page.click("header a[href='/fleet']")
        page.wait_for_url("**/fleet")
        page.locator("#tenants").wait_for()
        held = {t: page.locator(f'#tenants tr[data-tenant="{t}/NVIDIA-A30"] td').last.inner_text()
                for t in ("research", "product")}  # fmt: skip
        held_by = tenant_leftovers(fleet)  # what holds them, should the count be wrong
        assert held == {"research": "4", "product": "1"}, held_by  # holds's 4, other's 1
        screenshot(page, "fleet")
        page.click("header a[href='/serving']")
        page.wait_for_url("**/serving")
        page.locator('#services tr[data-name="product/served"]').wait_for()
        served = page.locator('#services tr[data-name="product/served"] td').all_inner_texts()
        assert served[4:7] == ["HorizontalPodAutoscaler", "1", "2"], served
        screenshot(page, "serving")


# Viewers of the chart's dashboard: (their ServiceAccount's namespace, the kind of role they are
# bound to, the role).
VIEWERS = {"dana": ("research", "Role", "gpufleet-user"),
           "pat": ("product", "Role", "gpufleet-user"),
           "ops": ("gpufleet-system", "ClusterRole", "cluster-admin")}  # fmt: skip


@pytest.fixture(scope="module")
def viewers(fleet: DevCluster) -> Iterator[dict[str, str]]:
    """The chart's dashboard account, as `helm install --set dashboard.enabled=true` makes it for
    the lab's release (its ServiceAccount, ClusterRole and bindings), and the tokens of viewers:
    dana holds research's gpufleet-user Role, pat product's, ops is a cluster admin."""
    from tests.support.chart import helm

    shown = helm("template", "lab", str(CHART), "-n", "gpufleet-system", "--set",
                 "dashboard.enabled=true", "--show-only", "templates/dashboard.yaml")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    account = [o for o in yaml.safe_load_all(shown.stdout) if o and o["kind"] in kinds]
    rbac, core, ns = fleet.typed("RbacAuthorizationV1Api"), fleet.core, "gpufleet-system"
    make = {"ServiceAccount": lambda o: core.create_namespaced_service_account(ns, o),
            "ClusterRole": rbac.create_cluster_role,
            "ClusterRoleBinding": rbac.create_cluster_role_binding}  # fmt: skip
    drop = {"ServiceAccount": lambda n: core.delete_namespaced_service_account(n, ns),
            "ClusterRole": rbac.delete_cluster_role,
            "ClusterRoleBinding": rbac.delete_cluster_role_binding}  # fmt: skip
    try:
        for obj in account:
            make[obj["kind"]](obj)
        tokens = {"dashboard": account_token(fleet, ns, "lab-dashboard", create=False)}
        yield tokens | {name: viewer_token(fleet, name, v) for name, v in VIEWERS.items()}
    finally:
        for name, v in VIEWERS.items():
            drop_viewer(fleet, name, v)
        for obj in account:
            with contextlib.suppress(ApiException):
                drop[obj["kind"]](obj["metadata"]["name"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_each_viewer_sees_only_what_their_token_may_read(
    fleet: DevCluster, viewers: dict[str, str]
) -> None:
    """The dashboard as the chart runs it (--auth token, the chart's account): the API server
    reviews each token; a tenant's user sees its own namespace's jobs, GPUs and services and
    not the other tenant's; the admin sees both, and the nodes (issue 53, item 3)."""
    env = token_env(fleet, "lab-dashboard", viewers["dashboard"])
    with (
        dashboard("--auth", "token", cwd=fleet.root, env=env) as url,
        httpx.Client(base_url=url, timeout=60) as web,
    ):
        assert "/login?next=" in web.get("/jobs").headers["location"]  # no token
        assert web.get("/jobs", headers=bearer("forged")).status_code == 401

        def seen(who: str, path: str, status: int = 200) -> str:
            got = web.get(path, headers=bearer(viewers[who]))
            assert got.status_code == status, (who, path, got.text[-2000:])
            return got.text

        for path in ("/jobs", "/queues", "/fleet", "/serving", "/jobs/research/holds",
                     "/jobs/product/other"):  # fmt: skip
            page = seen("ops", path)  # the chart's account reads every page's objects
            assert "forbidden" not in page, (path, page[-2000:])
        assert 'data-node="' in seen("ops", "/fleet")
        dana = seen("dana", "/jobs")
        assert 'data-name="research/holds"' in dana and 'data-name="research/waits"' in dana
        assert "product/" not in dana
        seen("dana", "/jobs/product/other", 404)
        fleet_page = seen("dana", "/fleet")
        assert 'data-tenant="research/' in fleet_page and 'data-tenant="product/' not in fleet_page
        assert 'id="no-nodes"' in fleet_page
        assert 'data-name="research/waits"' in seen("dana", "/queues")
        assert "product/served" not in seen("dana", "/serving")
        pat = seen("pat", "/jobs")
        assert 'data-name="product/other"' in pat and "research/" not in pat
        assert 'data-name="product/served"' in seen("pat", "/serving")
        seen("pat", "/jobs/research/holds", 404)


@needs_browser
def test_a_tenant_signs_in_in_a_browser_and_sees_its_namespace(
    fleet: DevCluster, viewers: dict[str, str]
) -> None:
    """Chromium on the chart's dashboard: the login page first, dana's token pasted, then the
    jobs page with research's jobs only; signing out brings the login page back."""
    env = token_env(fleet, "lab-dashboard", viewers["dashboard"])
    with chromium() as browser, dashboard("--auth", "token", "--refresh", "1", cwd=fleet.root,
                                          env=env) as url:  # fmt: skip
        page = browser.new_page()
        page.goto(f"{url}/jobs")
        page.wait_for_url("**/login?next=*")
        screenshot(page, "login")
        page.fill("#token", viewers["dana"])
        page.click("form button")
        page.wait_for_url("**/jobs")
        page.locator('#jobs tr[data-name="research/waits"]').wait_for()
        names = page.locator("#jobs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.name)")
        assert names and all(n.startswith("research/") for n in names), names
        assert (
            page.locator("#viewer").inner_text().startswith("system:serviceaccount:research:dana")
        )
        screenshot(page, "jobs-tenant")
        page.click("#viewer a")
        page.wait_for_url("**/login")
        page.goto(f"{url}/fleet")
        page.wait_for_url("**/login?next=*")  # the cookie is gone
