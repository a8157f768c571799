"""The chart's dashboard (off by default): a ServiceAccount that may get, list and watch what
the pages show and nothing else (no Secrets, no writes), the reviews of viewers' tokens, and a
`restricted` pod, behind a Service, with tokens required (on the API server:
tests/cluster/test_devcluster_queues_fleet.py; on real nodes: test_realnodes_dashboard.py)."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.cluster.kinds import (
    CLUSTER_QUEUES,
    JOB_KINDS,
    LOCAL_QUEUES,
    PODGROUPS,
    SERVING_KINDS,
    WORKLOADS,
)
from gpufleet.dashboard import DASHBOARD_PORT, REFRESH_S
from tests.support.chart import CHART, needs_helm, template

pytestmark = needs_helm
DESIGN = CHART / "ci" / "onprem-50node-values.yaml"
# What the pages read besides the custom kinds: (API group, resource) of the built-in lists.
BUILTIN_READS = {("", "pods"), ("", "events"), ("", "nodes"), ("", "services"),
                 ("", "namespaces"), ("apps", "deployments"),
                 ("autoscaling", "horizontalpodautoscalers")}  # fmt: skip


def dashboard_objects(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["kind"] + ("/" + o["metadata"]["name"] if o["kind"] == "ClusterRoleBinding" else ""): o
        for o in objects
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "dashboard"
    }


def test_off_by_default() -> None:
    assert dashboard_objects(template()) == {}


def test_its_account_reads_what_the_pages_show_and_nothing_else() -> None:
    found = dashboard_objects(template(DESIGN))
    rules = found["ClusterRole"]["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    assert {v for _, _, v in granted} == {"get", "list", "watch"}
    assert not any(r in ("secrets", "configmaps") for _, r, _ in granted)
    assert {(g, r) for g, r, v in granted if v != "get"} == {
        (g, r) for g, r, _ in granted if "/" not in r}  # subresources: get only  # fmt: skip
    kinds = [*JOB_KINDS, WORKLOADS, LOCAL_QUEUES, CLUSTER_QUEUES, PODGROUPS, *SERVING_KINDS]
    needed = {(k.group, k.plural) for k in kinds} | BUILTIN_READS
    for group, resource in needed:
        assert {(group, resource, v) for v in ("get", "list", "watch")} <= granted, resource
    assert {("", "pods/log", "get"), ("", "pods/proxy", "get")} <= granted
    bindings = [o for k, o in found.items() if k.startswith("ClusterRoleBinding/")]
    roles = sorted(b["roleRef"]["name"] for b in bindings)
    assert roles == ["gpufleet-dashboard", "system:auth-delegator"]  # token and access reviews
    assert all(b["subjects"][0]["name"] == "gpufleet-dashboard" for b in bindings)


def test_the_pod_asks_every_viewer_for_a_token() -> None:
    found = dashboard_objects(template(DESIGN))
    pod = found["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["gpufleet", "dashboard"]
    prometheus = "--prometheus=http://prometheus-operated.monitoring.svc:9090"
    assert {"--auth=token", "--address=0.0.0.0", "--history=s3://checkpoints/jobs",
            prometheus} <= set(command)  # fmt: skip
    assert pod["serviceAccountName"] == "gpufleet-dashboard"
    env = {e["name"]: e for e in container["env"]}
    assert "secretKeyRef" in env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]  # never a value
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = found["Service"]["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["targetPort"] == "http"


def test_the_charts_defaults_are_the_commands() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["dashboard"]
    assert values["enabled"] is False
    assert (values["port"], values["refresh"]) == (DASHBOARD_PORT, REFRESH_S)
