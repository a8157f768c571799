"""The chart's elastic controller (off by default): a ServiceAccount that may read Jobs and
Kueue's queues and Workloads and patch Jobs, nothing else; a policy that holds its patches to an
elastic Job's size within its node range (enforced by the API server: tests/cluster/
test_realnodes_elastic.py); a `restricted` pod running `gpufleet elastic-controller`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufleet.cluster.kinds import CLUSTER_QUEUES, LOCAL_QUEUES, WORKLOADS
from gpufleet.kube import ANNOTATION_NODE_RANGE, ANNOTATION_RESIZES, KUEUE_ELASTIC_JOB
from gpufleet.render import check_restricted
from tests.support.chart import CHART, needs_helm, template

pytestmark = needs_helm


def elastic_objects(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            == "elastic"}  # fmt: skip


def enabled(tmp_path: Path) -> dict[str, dict[str, Any]]:
    values = tmp_path / "elastic.yaml"
    values.write_text(yaml.safe_dump({"elastic": {"enabled": True, "interval": "3s"}}))
    return elastic_objects(template(values))


def test_off_by_default() -> None:
    assert elastic_objects(template()) == {}
    assert yaml.safe_load((CHART / "values.yaml").read_text())["elastic"]["enabled"] is False


def test_its_account_reads_queues_and_patches_jobs_and_nothing_else(tmp_path: Path) -> None:
    found = enabled(tmp_path)
    granted = {(g, r, v) for rule in found["ClusterRole"]["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    reads = {(k.group, k.plural, v) for k in (WORKLOADS, LOCAL_QUEUES, CLUSTER_QUEUES)
             for v in ("get", "list", "watch")}  # fmt: skip
    jobs = {("batch", "jobs", v) for v in ("get", "list", "watch", "patch")}
    assert granted == reads | jobs
    (subject,) = found["ClusterRoleBinding"]["subjects"]
    assert subject["name"] == found["ServiceAccount"]["metadata"]["name"] == "gpufleet-elastic"


def test_the_policy_holds_its_patches_to_an_elastic_jobs_size(tmp_path: Path) -> None:
    found = enabled(tmp_path)
    policy = found["ValidatingAdmissionPolicy"]["spec"]
    (condition,) = policy["matchConditions"]
    assert "system:serviceaccount:gpufleet-system:gpufleet-elastic" in condition["expression"]
    text = yaml.safe_dump(policy)
    for key in (KUEUE_ELASTIC_JOB, ANNOTATION_NODE_RANGE, ANNOTATION_RESIZES):
        assert key in text
    assert policy["failurePolicy"] == "Fail"
    binding = found["ValidatingAdmissionPolicyBinding"]["spec"]
    assert binding == {"policyName": "gpufleet-elastic", "validationActions": ["Deny"]}


def test_one_restricted_pod_runs_the_controller(tmp_path: Path) -> None:
    deployment = enabled(tmp_path)["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert check_restricted(pod) == []
    (container,) = pod["containers"]
    assert container["command"] == ["gpufleet", "elastic-controller", "--interval=3s"]
    assert pod["serviceAccountName"] == "gpufleet-elastic"
