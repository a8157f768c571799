"""The chart's dashboard on real nodes (issue 53, item 3): `helm upgrade --set
dashboard.enabled=true` with the project's image runs `gpufleet dashboard --auth token` in a
pod on a real node, behind its Service. Through the Service
(`kubectl port-forward`): no page without a token; the API server reviews a tenant's token and
an admin's; the admin sees the real nodes, the tenant its own namespace only. The pod passes
Pod Security `restricted` as the API server enforces it. (Tenants' isolation, page by page:
tests/cluster/test_devcluster_queues_fleet.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2 as httpx  # what the dev extra installs (Starlette's test client uses it)
import pytest
from kubernetes.client.exceptions import ApiException

from gpufleet.dashboard import DASHBOARD_PORT
from gpufleet.devcluster import platform
from tests.support.accounts import drop_viewer, port_forward, viewer_token
from tests.support.devcluster import CHART, DevCluster
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT, project_image

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
NAME = f"{platform.RELEASE}-dashboard"
SELECTOR = "app.kubernetes.io/component=dashboard"


# The real nodes are GPU nodes, tainted so (devcluster/realnodes: GPU_TAINT): nothing else runs.
TOLERATE = 'dashboard.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists"}]'


def upgrade(cluster: DevCluster, *sets: str) -> None:
    tolerate = ("--set-json", TOLERATE) if "dashboard.enabled=true" in sets else ()
    cluster.helm("upgrade", platform.RELEASE, str(CHART), "-n", platform.NAMESPACE,
                 "--reuse-values", *(a for s in sets for a in ("--set", s)), *tolerate)  # fmt: skip


def ready(cluster: DevCluster) -> bool:
    pods = dashboard_pods(cluster)
    return len(pods) == 1 and any(c.type == "Ready" and c.status == "True"
                                  for c in pods[0].status.conditions or [])  # fmt: skip


def why_not_ready(cluster: DevCluster) -> str:
    """The dashboard pods' phase, conditions, container states and logs."""
    out = []
    for pod in dashboard_pods(cluster):
        out.append(f"{pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase}; "
                   f"{[(c.type, c.status, c.message) for c in pod.status.conditions or []]}; "
                   f"{[s.state for s in pod.status.container_statuses or []]}")  # fmt: skip
        try:
            log = cluster.core.read_namespaced_pod_log(pod.metadata.name, platform.NAMESPACE)
            out.append(str(log)[-3000:])
        except ApiException as exc:
            out.append(f"(no log: {exc.reason})")
    return "\n".join(out)


@pytest.fixture(scope="module")
def deployed(reallab: DevCluster) -> Iterator[dict[str, str]]:
    """The dashboard deployed by the chart, Ready; tokens of a tenant's user (research's
    gpufleet-user Role) and of an admin (cluster-admin)."""
    repository, tag = project_image()[0].rsplit(":", 1)
    viewers = {"dana": (TENANT, "Role", "gpufleet-user"),
               "ops": (platform.NAMESPACE, "ClusterRole", "cluster-admin")}  # fmt: skip
    try:
        upgrade(reallab, "dashboard.enabled=true", f"dashboard.image.repository={repository}",
                f"dashboard.image.tag={tag}", "dashboard.image.pullPolicy=Never")  # fmt: skip
        try:
            poll_until(lambda: ready(reallab), what="the dashboard's pod Ready", timeout=180,
                       interval=2)  # fmt: skip
        except BaseException as exc:
            raise AssertionError(why_not_ready(reallab)) from exc
        yield {name: viewer_token(reallab, name, v) for name, v in viewers.items()}
    finally:
        for name, v in viewers.items():
            drop_viewer(reallab, name, v)
        upgrade(reallab, "dashboard.enabled=false")
        poll_until(lambda: not dashboard_pods(reallab), what="the dashboard's pod gone",
                   timeout=120, interval=2)  # fmt: skip


def dashboard_pods(cluster: DevCluster) -> list[Any]:
    return list(cluster.core.list_namespaced_pod(platform.NAMESPACE,
                                                 label_selector=SELECTOR).items)  # fmt: skip


def test_the_charts_dashboard_runs_restricted_on_a_real_node(
    reallab: DevCluster, deployed: dict[str, str]
) -> None:
    (pod,) = dashboard_pods(reallab)
    assert pod.status.phase == "Running" and pod.spec.node_name.startswith("real-")
    # Pod Security admission, `restricted`, as research enforces it: the same pod, dry run
    spec = reallab.as_dict(pod.spec)
    for field in ("nodeName", "serviceAccountName", "serviceAccount"):  # its account is not there
        spec.pop(field, None)
    spec["volumes"] = [v for v in spec["volumes"] if not v["name"].startswith("kube-api-access")]
    for container in spec["containers"]:
        container["volumeMounts"] = [m for m in container["volumeMounts"]
                                     if not m["name"].startswith("kube-api-access")]  # fmt: skip
    body = {"metadata": {"name": "dashboard-restricted-check"}, "spec": spec}
    reallab.core.create_namespaced_pod(TENANT, body, dry_run="All")
    forwarded = port_forward(reallab, platform.NAMESPACE, f"svc/{NAME}", DASHBOARD_PORT)
    with forwarded as address, httpx.Client(base_url=f"http://{address}", timeout=60) as web:
        assert web.get("/healthz").text == "ok\n"
        missing = web.get("/jobs")
        assert missing.status_code == 303 and "/login?next=" in missing.headers["location"]
        assert web.get("/fleet", headers=bearer("forged")).status_code == 401
        ops = web.get("/fleet", headers=bearer(deployed["ops"]))
        assert ops.status_code == 200 and 'data-node="real-' in ops.text, ops.text[-2000:]
        signed = web.post("/login", data={"token": deployed["dana"], "next": "/fleet"})
        assert signed.status_code == 303 and signed.headers["location"] == "/fleet"
        dana = web.get("/fleet")  # the cookie the sign-in set
        assert dana.status_code == 200 and 'id="no-nodes"' in dana.text
        assert "dana" in dana.text and 'data-node="' not in dana.text


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
