"""The platform chart: helm lint --strict, every ci/ scenario renders strictly valid objects,
restricted pods, default-deny tenants, no RBAC wildcards, and clear failures on bad values."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.cluster.doctor.requirements import RDMA_POLICY
from gpufleet.kube import LABEL_RDMA, LABEL_TENANT
from gpufleet.render import check_restricted, pod_specs_in
from tests.support.chart import CHART, helm, needs_helm, template
from tests.support.k8s_schemas import validate_strictly

SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))

pytestmark = needs_helm


EXPORTER_EXCEPTIONS = {
    "spec.template.spec.volumes[0]",
    "spec.template.spec.securityContext.runAsUser",
    "spec.template.spec.containers[0].securityContext.runAsNonRoot",
}


def _pod_resources(values: dict[str, Any]) -> bool:
    exporter = values.get("monitoring", {}).get("exporter", {"enabled": True})
    return bool(exporter["enabled"] and exporter.get("podResources", {"enabled": True})["enabled"])


def test_scenarios_exist() -> None:
    names = {p.name for p in SCENARIOS}
    assert names == {"minimal-values.yaml", "lab-3node-a30-values.yaml",
                     "onprem-50node-values.yaml"}  # fmt: skip


@pytest.mark.parametrize("values", [None, *SCENARIOS], ids=lambda p: p.name if p else "defaults")
def test_lint_strict(values: Path | None) -> None:
    proc = helm("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.name)
def test_scenario_objects_are_valid_and_safe(values: Path) -> None:
    objects = template(values)
    scenario = yaml.safe_load(values.read_text())
    kinds = [o["kind"] for o in objects]
    for obj in objects:
        validate_strictly(obj)
        for path, pod in pod_specs_in(obj):
            errors = {e.path for e in check_restricted(pod, path)}
            if obj["metadata"]["name"] == "gpufleet-exporter" and _pod_resources(scenario):
                # The documented exception, and nothing more: the socket's hostPath, as root.
                assert errors == EXPORTER_EXCEPTIONS, errors
            else:
                assert not errors, errors
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj["rules"]:
                for key in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(key, []), (obj["metadata"]["name"], rule)
    tenants = [t["name"] for t in scenario["tenants"]]
    namespaces = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Namespace"}
    assert sorted(namespaces) == sorted(tenants)
    rdma = {t["name"] for t in scenario["tenants"] if t.get("rdma")}
    for name, ns in namespaces.items():
        labels = ns["metadata"]["labels"]
        if name in rdma:  # held to restricted plus IPC_LOCK by the chart's policy instead
            assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
            assert labels[LABEL_RDMA] == "true"
            assert_rdma_policy_binds(objects)
        else:
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
            assert LABEL_RDMA not in labels
        deny = [
            o for o in objects
            if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == name
            and o["spec"]["podSelector"] == {} and "ingress" not in o["spec"]
            and "egress" not in o["spec"]
            and sorted(o["spec"]["policyTypes"]) == ["Egress", "Ingress"]
        ]  # fmt: skip
        assert deny, f"tenant {name} has no default-deny NetworkPolicy"
        quota = next(
            o
            for o in objects
            if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == name
        )
        assert "requests.nvidia.com/gpu" in quota["spec"]["hard"]
    assert kinds.count("ClusterQueue") == kinds.count("LocalQueue") == len(tenants)


def assert_rdma_policy_binds(objects: list[dict[str, Any]]) -> None:
    """The rdma tenants' ValidatingAdmissionPolicy exists, fails closed, and its binding
    denies in every tenant's namespace (tests/cluster/test_devcluster_design.py proves what it
    refuses on a real API server)."""
    (policy,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == RDMA_POLICY
    ]  # what doctor looks for
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                  and o["spec"]["policyName"] == RDMA_POLICY]  # fmt: skip
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchExpressions": [{"key": LABEL_TENANT, "operator": "Exists"}]}


def test_onprem_has_flavors_cohort_topology_volcano_and_ceph() -> None:
    objects = template(CHART / "ci" / "onprem-50node-values.yaml")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    flavors = {f["metadata"]["name"]: f for f in by_kind["ResourceFlavor"]}
    assert flavors["h100"]["spec"]["nodeLabels"]["nvidia.com/gpu.product"].startswith("NVIDIA-H100")
    assert flavors["h100"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert flavors["h100"]["spec"]["topologyName"] == "racks"
    cq = next(c for c in by_kind["ClusterQueue"] if c["metadata"]["name"] == "llm")
    assert cq["spec"]["cohortName"] == "onprem"
    assert cq["spec"]["preemption"]["reclaimWithinCohort"] == "Any"
    groups = cq["spec"]["resourceGroups"][0]
    assert [f["name"] for f in groups["flavors"]] == ["cpu", "h100"]  # CPU pool tried first
    gpu = next(r for r in groups["flavors"][1]["resources"] if r["name"] == "nvidia.com/gpu")
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "56", "borrowingLimit": "16",
                   "lendingLimit": "16"}  # fmt: skip
    assert {q["metadata"]["name"] for q in by_kind["Queue"]} == {"llm", "vision", "inference"}
    classes = {s["metadata"]["name"]: s for s in by_kind["StorageClass"]}
    assert classes["local-nvme"]["volumeBindingMode"] == "WaitForFirstConsumer"
    assert classes["local-nvme"]["provisioner"] == "kubernetes.io/no-provisioner"
    assert classes["ceph-rbd"]["provisioner"] == "rbd.csi.ceph.com"
    assert classes["cephfs"]["provisioner"] == "cephfs.csi.ceph.com"
    default_key = "storageclass.kubernetes.io/is-default-class"
    default = [
        n for n, s in classes.items() if s["metadata"].get("annotations", {}).get(default_key)
    ]
    assert default == ["ceph-rbd"]
    assert len(by_kind["Topology"]) == 1


LAB = yaml.safe_load((CHART / "ci" / "lab-3node-a30-values.yaml").read_text())


def _bad(change: Any) -> dict[str, Any]:
    values = copy.deepcopy(LAB)
    change(values)
    return values


def _set(path: list[Any], value: Any) -> Any:
    def change(values: dict[str, Any]) -> None:
        target: Any = values
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


_CHAT = {"name": "chat", "slack": {"secret": {"name": "hooks", "key": "slack"}}}


def _alerting(**values: Any) -> Any:
    def change(v: dict[str, Any]) -> None:
        alerting = {"enabled": True, "receivers": [_CHAT], **values}
        v.setdefault("monitoring", {})["alerting"] = alerting

    return change


_SIDE = {"endpoint": "http://minio.minio.svc:9000", "existingSecret": "minio-credentials"}


def _mirror(source: str, destination: str) -> Any:
    return _set(["storage", "mirror"], {"enabled": True, "source": {**_SIDE, "path": source},
                                        "destination": {**_SIDE, "path": destination}})  # fmt: skip


BAD_VALUES = [
    ("duplicate tenant", lambda v: v["tenants"].append(copy.deepcopy(v["tenants"][0])),
     "tenants[2].name"),
    ("unknown flavor", _set(["tenants", 0, "queue", "flavors", 0, "name"], "h100"),
     "tenants[0].queue.flavors[0].name"),
    ("quota below queue", _set(["tenants", 1, "quota", "gpu"], 2), "tenants[1].quota.gpu"),
    ("lend more than owned", _set(["tenants", 1, "queue", "flavors", 0, "gpu", "lendingLimit"], 9),
     "tenants[1].queue.flavors[0].gpu.lendingLimit"),
    ("system namespace", _set(["tenants", 0, "name"], "kube-system"), "tenants[0].name"),
    ("pod labels without the socket", _set(["monitoring", "exporter", "podResources"],
     {"enabled": False, "podLabels": True}), "monitoring.exporter.podResources.podLabels"),
    ("unknown monitoring key", _set(["monitoring", "exporter", "hostNetwork"], True),
     "hostNetwork"),
    ("default class off", _set(["storage", "defaultClass"], "cephfs"), "storage.defaultClass"),
    ("ceph without cluster", _set(["storage", "cephRbd", "enabled"], True), "storage.cephRbd"),
    ("topology without kueue", lambda v: v.update(kueue={**v["kueue"], "enabled": False,
     "topology": {"enabled": True, "name": "t", "levels": ["kubernetes.io/hostname"]}}),
     "kueue.topology.enabled"),
    ("unknown key", _set(["tenants", 0, "quota", "gpus"], 4), "gpus"),
    ("topology without node labels", lambda v: (v["flavors"][0].update(nodeLabels={}),
     v["kueue"].update(topology={**v["kueue"]["topology"], "enabled": True})),
     "flavors[0].nodeLabels"),
    ("bad tenant name", _set(["tenants", 0, "name"], "Team_A"), "name"),
    # The audit of issue 11: values that rendered, then broke a real cluster.
    ("monitoring as a tenant", _set(["tenants", 0, "name"], "monitoring"), "tenants[0].name"),
    ("kube-* as a tenant", _set(["tenants", 0, "name"], "kube-flannel"), "tenants[0].name"),
    ("duplicate flavor", lambda v: v["flavors"].append(copy.deepcopy(v["flavors"][0])),
     "flavors[1].name"),
    ("flavor twice in a queue", lambda v: v["tenants"][0]["queue"]["flavors"].append(
     copy.deepcopy(v["tenants"][0]["queue"]["flavors"][0])), "tenants[0].queue.flavors[1].name"),
    # product may borrow the 4 GPUs research lends (no borrowingLimit): 10 > its quota of 6
    ("borrowing beyond the namespace quota", _set(["tenants", 1, "quota", "gpu"], 6),
     "tenants[1].quota.gpu: Kueue can admit up to 10 of gpu"),
    ("cpu nominal beyond the namespace quota", _set(["tenants", 0, "quota", "cpu"], "16"),
     "tenants[0].quota.cpu: Kueue can admit up to 96 of cpu"),
    ("memory beyond the quota, in other units", _set(["tenants", 0, "quota", "memory"], "0.25Ti"),
     "tenants[0].quota.memory: Kueue can admit up to 384Gi of memory"),
    ("alerting without receivers", _alerting(receivers=[]), "monitoring.alerting.receivers:"),
    ("alerting that drops everything", _alerting(), "monitoring.alerting.routes: no route"),
    ("route to no receiver", _alerting(routes=[{"receiver": "pager"}]),
     'monitoring.alerting.routes[0].receiver: "pager" is not one of'),
    ("route for no tenant", _alerting(routes=[{"receiver": "chat", "tenants": ["ghost"]}]),
     "monitoring.alerting.routes[0].tenants[0]"),
    ("default to no receiver", _alerting(defaultReceiver="pager"),
     "monitoring.alerting.defaultReceiver"),
    ("receiver twice", _alerting(receivers=[_CHAT, _CHAT]),
     "monitoring.alerting.receivers[1].name"),
    ("two integrations in one receiver", _alerting(receivers=[{**_CHAT, "webhook": {"url":
     "https://x.example"}}]), "/monitoring/alerting/receivers/0"),
    ("hook URL in the values", _alerting(receivers=[{"name": "chat", "slack": {"url":
     "https://hooks.slack.com/services/T/B/X"}}]), "/monitoring/alerting/receivers/0"),
    ("mirror without a source", _mirror("", "backup"), "storage.mirror.source.path: required"),
    ("mirror onto itself", _mirror("ckpt/jobs", "ckpt/jobs/"),
     "storage.mirror.destination.path: the same bucket and path"),
    ("a priority the cluster lacks", _set(["tenants", 1, "priorityClasses"], ["urgent"]),
     'tenants[1].priorityClasses[0]: "urgent" is not one of kueue.priorityClasses'),
    ("local NVMe kept by mistake", _set(["storage", "localNvme", "reclaimPolicy"], "Recycle"),
     "/storage/localNvme/reclaimPolicy"),
]  # fmt: skip


def test_a_borrowing_limit_within_the_quota_renders(tmp_path: Path) -> None:
    """The same product tenant renders with its quota of 6 once it may not borrow: the check
    counts borrowing as Kueue does, not more."""
    values = _bad(_set(["tenants", 1, "quota", "gpu"], 6))
    values["tenants"][1]["queue"]["flavors"][0]["gpu"]["borrowingLimit"] = 0
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = helm("template", "gpufleet", str(CHART), "-f", str(path))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("label", "change", "path"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_contradictory_values_fail_with_the_path(
    label: str, change: Any, path: str, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_bad(change)))
    proc = helm("template", "gpufleet", str(CHART), "-f", str(values))
    assert proc.returncode != 0, f"{label}: rendered anyway"
    assert path in proc.stderr, proc.stderr


def test_the_charts_rdma_device_is_the_specs_default() -> None:
    """rdma.resourceName (what the cluster's device plugin advertises) and spec.rdma.resource's
    default name the same device, so a job asks for what the chart's tenants expect."""
    from gpufleet.spec import DEFAULT_RDMA_RESOURCE

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rdma"]["resourceName"] == DEFAULT_RDMA_RESOURCE
    assert all(not t.get("rdma") for t in values["tenants"])  # opt-in


def test_each_tenants_priorities_are_the_tenant_policys_parameters_in_its_namespace() -> None:
    """templates/tenant-policy.yaml: one policy for every tenant namespace, its parameters the
    ConfigMap of the namespace admitted to (a tenant's Role cannot change ConfigMaps), each
    holding that tenant's priorityClasses ("": any); a namespace without one is not held."""
    objects = template(CHART / "ci" / "lab-3node-a30-values.yaml")
    params = {
        o["metadata"]["namespace"]: o["data"]["priorityClasses"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpufleet-tenant-policy"
    }
    assert params == {"research": "", "product": "normal"}
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                  and o["spec"]["policyName"] == "gpufleet-tenant-policy"]  # fmt: skip
    assert binding["spec"]["paramRef"] == {"name": "gpufleet-tenant-policy",
                                           "parameterNotFoundAction": "Allow"}  # fmt: skip
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [{"key": LABEL_TENANT, "operator": "Exists"}]
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "gpufleet-user"]
    assert roles and not any("configmaps" in r.get("resources", []) for o in roles
                             for r in o["rules"])  # fmt: skip
