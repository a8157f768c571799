"""`gpufleet doctor`'s checks on facts as the API server returns them: a healthy cluster is all
OK, and each thing a cluster can lack gives its own FAIL or WARN line with a fix."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.cluster.doctor import Facts, Status, diagnose
from gpufleet.cluster.doctor.requirements import (
    CONTROLLERS,
    DEFAULT_STORAGE_CLASS,
    KUEUE_CONFIGMAP,
    KUEUE_SETTINGS,
    NAD_CRD,
    TARGET_NEEDS,
)
from gpufleet.errors import EXIT_BAD_INPUT
from gpufleet.kube import LABEL_RDMA, LABEL_TENANT

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def crd(name: str, versions: list[str], fields: tuple[str, ...] = ()) -> dict[str, Any]:
    spec = {"properties": {f: {"type": "object"} for f in fields}}
    schema = {"openAPIV3Schema": {"properties": {"spec": spec}}}
    return {"metadata": {"name": name},
            "spec": {"versions": [{"name": v, "served": True, "schema": schema}
                                  for v in versions]}}  # fmt: skip


def healthy() -> Facts:
    """A cluster with every controller running in Deployments, GPU nodes, DNS, tenants."""
    facts = Facts(version="v1.36.3", now=NOW)
    for c in CONTROLLERS:
        for name, version in c.crds:
            facts.crds[name] = crd(name, [version], ("runtimePatches",))
        for p in c.processes:
            meta = {"name": p.deployment, "namespace": c.name}
            ready = {"metadata": meta, "spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
            facts.deployments.append(ready)
            if p.webhook_service:
                facts.webhook_services.add(f"{c.name}/{p.webhook_service}")
                facts.probes[p.deployment] = ""
    for name in ("podmonitors", "servicemonitors", "prometheusrules"):
        facts.crds[f"{name}.monitoring.coreos.com"] = crd(name, ["v1"])
    frameworks = [n.kueue_framework for n in TARGET_NEEDS.values() if n.kueue_framework]
    facts.kueue_config = {"integrations": {"frameworks": frameworks},
                          "waitForPodsReady": {"timeout": "10m"}}  # fmt: skip
    facts.nodes = [{"metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.product": "H100",
                                                             "nvidia.com/gpu.count": "8"}},
                    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
                    "status": {"allocatable": {"nvidia.com/gpu": "8"}}}]  # fmt: skip
    facts.daemonsets = [{"metadata": {"name": "nvidia-device-plugin-daemonset",
                                      "namespace": "gpu-operator"},
                         "status": {"desiredNumberScheduled": 1, "numberReady": 1}}]  # fmt: skip
    default = {DEFAULT_STORAGE_CLASS: "true"}
    facts.storage_classes = [{"metadata": {"name": "fast", "annotations": default}}]
    tenant = {LABEL_TENANT: "research", "pod-security.kubernetes.io/enforce": "restricted"}
    facts.namespaces = [{"metadata": {"name": "research", "labels": tenant}}]
    facts.dns_services = [{"metadata": {"name": "kube-dns"}}]
    facts.dns_endpoints = [{"endpoints": [{"addresses": ["10.0.0.10"],
                                           "conditions": {"ready": True}}]}]  # fmt: skip
    return facts


def lines(facts: Facts, targets: list[str] | None = None) -> dict[str, tuple[Status, str]]:
    return {f.check: (f.status, f.detail + " | " + f.fix) for f in diagnose(facts, targets or [])}


def not_ok(facts: Facts, targets: list[str] | None = None) -> dict[str, tuple[Status, str]]:
    return {k: v for k, v in lines(facts, targets).items() if v[0] is not Status.OK}


def test_a_healthy_cluster_is_all_ok() -> None:
    assert not_ok(healthy()) == {}


def test_an_old_api_server_fails() -> None:
    facts = healthy()
    facts.version = "v1.29.4-gke.100"
    status, text = lines(facts)["kubernetes"]
    assert status is Status.FAIL and "older than v1.31" in text


def test_crds_missing_unserved_or_too_old_fail_naming_the_crd() -> None:
    facts = healthy()
    del facts.crds["jobsets.jobset.x-k8s.io"]
    facts.crds["mpijobs.kubeflow.org"] = crd("mpijobs.kubeflow.org", ["v1"])
    trainjobs = "trainjobs.trainer.kubeflow.org"
    facts.crds[trainjobs] = crd(trainjobs, ["v1alpha1"])  # no spec.runtimePatches
    bad = not_ok(facts)
    assert (
        bad["jobset CRDs"][0] is Status.FAIL and "jobsets.jobset.x-k8s.io" in bad["jobset CRDs"][1]
    )
    assert "does not serve v2beta1 (serves v1)" in bad["mpi-operator CRDs"][1]
    assert "no spec.runtimePatches: older than v2.2.0" in bad["trainer CRDs"][1]


def test_a_controller_runs_by_its_deployment_or_its_lease_and_fails_with_neither() -> None:
    facts = healthy()
    facts.deployments = [d for d in facts.deployments if d["metadata"]["name"] != "mpi-operator"]
    lease = {"metadata": {"name": "mpi-operator", "namespace": "mpi-operator"},
             "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15,
                      "renewTime": (NOW - timedelta(seconds=3)).isoformat()}}  # fmt: skip
    facts.leases = [lease]
    assert lines(facts)["mpi-operator mpi-operator"][0] is Status.OK
    lease["spec"]["renewTime"] = (NOW - timedelta(minutes=10)).isoformat()
    status, text = lines(facts)["mpi-operator mpi-operator"]
    assert status is Status.FAIL and "no Lease mpi-operator renewed lately" in text
    facts.deployments.append({"metadata": {"name": "mpi-operator", "namespace": "mpi"},
                              "spec": {"replicas": 1}, "status": {}})  # fmt: skip
    status, text = lines(facts)["mpi-operator mpi-operator"]
    assert status is Status.FAIL and "mpi/mpi-operator has no ready replica" in text


def test_webhooks_that_do_not_answer_or_are_not_configured_fail() -> None:
    facts = healthy()
    facts.probes["kueue-controller-manager"] = "failed calling webhook: connection refused"
    assert "connection refused" in not_ok(facts)["kueue webhooks"][1]
    facts = healthy()
    facts.webhook_services.clear()
    del facts.probes["jobset-controller-manager"]
    status, text = lines(facts)["jobset webhooks"]
    assert status is Status.FAIL and "no webhook configuration calls" in text


def test_an_absent_controller_warns_unless_a_named_target_needs_it() -> None:
    facts = healthy()
    for name, _ in next(c for c in CONTROLLERS if c.name == "kuberay").crds:
        del facts.crds[name]
    facts.deployments = [
        d for d in facts.deployments if d["metadata"]["name"] != "kuberay-operator"
    ]
    status, text = lines(facts)["kuberay"]
    assert status is Status.WARN and "rayjob cannot run" in text
    assert lines(facts, ["rayjob"])["kuberay CRDs"][0] is Status.FAIL
    assert "kuberay" not in lines(facts, ["jobset"])  # not needed, not checked


def test_kueue_must_queue_the_kinds_of_the_targets_in_use() -> None:
    facts = healthy()
    assert facts.kueue_config is not None
    facts.kueue_config["integrations"]["frameworks"].remove("kubeflow.org/pytorchjob")
    status, text = lines(facts)["kueue integrations"]
    assert status is Status.FAIL and "kubeflow.org/pytorchjob (target pytorchjob)" in text
    assert KUEUE_CONFIGMAP in text
    assert lines(facts, ["jobset"])["kueue integrations"][0] is Status.OK
    facts.kueue_config = None
    assert lines(facts)["kueue integrations"][0] is Status.WARN


def test_gpu_nodes_without_gpus_labels_or_taint() -> None:
    facts = healthy()
    node = facts.nodes[0]
    plain = copy.deepcopy(node)
    plain["metadata"] = {"name": "gpu-1", "labels": {}}
    plain["spec"] = {}
    facts.nodes.append(plain)
    bad = not_ok(facts)
    assert bad["gpu labels"][0] is Status.WARN and "gpu-1 lack" in bad["gpu labels"][1]
    assert "gpu-1 not tainted" in bad["gpu taint"][1]
    facts.nodes = [{"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}}]
    assert lines(facts)["gpu nodes"][0] is Status.FAIL


def test_device_plugin_storage_pod_security_and_dns() -> None:
    facts = healthy()
    facts.daemonsets[0]["status"]["numberReady"] = 0
    facts.storage_classes[0]["metadata"]["annotations"] = {}
    facts.namespaces[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"
    facts.dns_endpoints = [{"endpoints": [{"conditions": {"ready": False}}]}]
    bad = not_ok(facts)
    assert bad["device plugin"][0] is Status.FAIL and "0/1 ready" in bad["device plugin"][1]
    assert bad["storage"][0] is Status.WARN
    assert bad["pod security"][0] is Status.FAIL and "research (baseline)" in bad["pod security"][1]
    assert bad["dns"][0] is Status.FAIL and "no ready endpoint" in bad["dns"][1]
    facts.dns_services = []
    assert "no Service in kube-system" in lines(facts)["dns"][1]


def test_what_the_api_server_would_not_show_fails_saying_so() -> None:
    facts = healthy()
    facts.errors["nodes"] = "list node: forbidden: User x cannot list nodes"
    status, text = lines(facts)["gpu nodes"]
    assert status is Status.FAIL and "forbidden" in text


@pytest.mark.parametrize("target", ["nope", "JOB"])
def test_an_unknown_target_is_bad_input(target: str) -> None:
    result = CliRunner().invoke(app, ["doctor", "--target", target])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "--target" in result.output and "one of: job, jobset" in result.output


def test_kueue_without_all_or_nothing_admission_warns() -> None:
    facts = healthy()
    assert facts.kueue_config is not None
    facts.kueue_config["waitForPodsReady"] = {"timeout": "10m"}
    assert lines(facts)["kueue pods ready"][0] is Status.OK
    del facts.kueue_config["waitForPodsReady"]
    status, text = lines(facts)["kueue pods ready"]
    assert status is Status.WARN and KUEUE_SETTINGS in text


def test_the_charts_kueue_settings_queue_every_targets_kind_and_admit_all_or_nothing() -> None:
    """deploy/helm/gpufleet/files/kueue-config.yaml, what a cluster's Kueue is told to run
    with, passes doctor's Kueue checks for every target."""
    from gpufleet.devcluster.addons import chart_kueue_config

    facts = healthy()
    facts.kueue_config = chart_kueue_config()
    frameworks = set(facts.kueue_config["integrations"]["frameworks"])
    assert frameworks == {n.kueue_framework for n in TARGET_NEEDS.values() if n.kueue_framework}
    checks = lines(facts, list(TARGET_NEEDS))
    assert checks["kueue integrations"][0] is checks["kueue pods ready"][0] is Status.OK


def test_rdma_tenants_need_multus_and_rdma_devices() -> None:
    facts = healthy()
    assert "rdma" not in lines(facts)  # no tenant uses it: no line
    labels = facts.namespaces[0]["metadata"]["labels"]
    labels[LABEL_RDMA] = "true"  # still restricted: its RDMA workers would be refused
    status, text = lines(facts)["rdma"]
    assert status is Status.FAIL and "refuses IPC_LOCK" in text
    labels["pod-security.kubernetes.io/enforce"] = "privileged"  # as the chart makes it
    status, text = lines(facts)["rdma"]
    assert status is Status.FAIL and "not held to restricted" in text  # no policy
    assert lines(facts)["pod security"][0] is Status.OK  # the policy's line says it
    facts.rdma_policy = True
    status, text = lines(facts)["rdma"]
    assert status is Status.FAIL and "network-attachment-definitions" in text
    facts.crds[NAD_CRD] = crd(NAD_CRD, ["v1"])
    status, text = lines(facts)["rdma"]
    assert status is Status.FAIL and "no node advertises an RDMA device" in text
    facts.nodes[0]["status"]["allocatable"]["rdma/rdma_shared_device_a"] = "64"
    status, text = lines(facts)["rdma"]
    assert status is Status.OK and "research" in text
