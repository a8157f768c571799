"""Queued jobs on the lab's queues, on the real controllers (issue 11): jobs of every target
admitted by Kueue and run by their controllers on kwok's GPU nodes, the MPIJob's launcher
beside its workers, gangs that wait for quota, cohort borrowing with preemption, and what Kueue
admits with borrowing the namespace quota also allows; then the Queues dashboard's queries
answered by the running Kueue (issue 14).

All on the session's local cluster with the chart's lab (tests/support/devlab.py: tenants
research and product in cohort "lab", 3 nodes x 4 A30).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.kwok import RUN_FOR_A_DAY, exit_with
from tests.support.accounts import account_token
from tests.support.devcluster import (
    CLUSTER_POLL_S,
    DevCluster,
    condition,
    needs_controlplane,
    workload_of,
)
from tests.support.devlab import bound_claim, queued_job
from tests.support.paths import REPO
from tests.support.procs import poll_until
from tests.support.specs import pod_templates, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]


def submit_annotated(cluster: DevCluster, doc: dict[str, Any], target: str,
                     annotations: dict[str, str]) -> None:  # fmt: skip
    """Render ``doc`` for ``target``, put ``annotations`` on its pods (kwok Stages) and create
    it as `gpufleet submit` does."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    objects = render(validate_training_job(doc), target)
    for obj in objects:
        for template in pod_templates(obj):
            meta = template.setdefault("metadata", {})
            meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    Cluster(cluster.custom, cluster.core, doc["metadata"]["namespace"]).submit(objects)


PYTORCH_INDEX = "training.kubeflow.org/replica-index"  # the training-operator's pod label


def rank_and_address(cluster: DevCluster, pod: dict[str, Any], target: str) -> tuple[str, str]:
    """A pod's index in its job and the stable name other pods reach it by: the Job
    controller's completion index and hostname.subdomain, or the training-operator's replica
    index and the Service it creates for that replica (which must select this very pod)."""
    if target not in ("pytorchjob", "tfjob"):
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        return index, f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}"
    labels = pod["metadata"]["labels"]
    index = labels[PYTORCH_INDEX]
    service = cluster.core.read_namespaced_service(pod["metadata"]["name"],
                                                   pod["metadata"]["namespace"])  # fmt: skip
    selector = service.spec.selector or {}
    assert selector and all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    return index, service.metadata.name


@pytest.mark.parametrize("target", ["job", "jobset", "pytorchjob", "trainjob", "tfjob"])
def test_a_queued_job_is_admitted_run_and_cancelled_clean(lab: DevCluster, target: str) -> None:
    """Kueue admits the job (for a PyTorchJob, because the cluster turned on the integration
    Kueue's defaults leave off), the controller creates one pod per node with GPU requests on
    GPU nodes, all meet at index 0's stable name, kwok completes them, status says Succeeded;
    cancel leaves nothing. The PyTorchJob runs in research, which enforces `restricted`: its
    pods are admitted because gpufleet renders no Master (the operator would add its
    init-pytorch container, which `restricted` refuses, to every Worker)."""
    name, ns = f"queued-{target}", "research"
    doc = queued_job(name, ns, nodes=2, gpus=2, target=target)
    if target == "tfjob":
        bound_claim(lab, ns, doc["spec"]["volumes"][0]["claimName"])
    try:
        check_queued_job(lab, doc, target)
    finally:
        if target == "tfjob":
            claim = doc["spec"]["volumes"][0]["claimName"]
            lab.core.delete_namespaced_persistent_volume_claim(claim, ns)
            lab.core.delete_persistent_volume(f"{ns}-{claim}")


def check_queued_job(lab: DevCluster, doc: dict[str, Any], target: str) -> None:
    """Submit ``doc`` for ``target``; admitted, run by the controller, cancelled clean."""
    name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
    procs = 1 if target == "tfjob" else 2  # a TensorFlow worker uses the node's GPUs
    path = write_spec(lab.root, doc, f"{name}.yaml")
    submit = lab.gpufleet("submit", str(path), "--target", target)
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert lab.wait_phase(name, ns, "Succeeded", "Failed") == "Succeeded"
    wl = workload_of(lab, ns, name)
    assert condition(wl, "Admitted"), wl
    assert wl is not None and wl["status"]["admission"]["clusterQueue"] == "research"
    pods = lab.pods(ns, name)
    assert len(pods) == 2
    endpoints, hosts = set(), {}
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert pod["status"]["phase"] == "Succeeded"
        assert not pod["spec"].get("initContainers"), pod["spec"]["initContainers"]
        args = container["command"]
        assert "--nnodes=2" in args and f"--nproc-per-node={procs}" in args
        endpoints |= {a.split("=", 1)[1] for a in args if a.startswith("--rdzv-endpoint=")}
        index, address = rank_and_address(lab, pod, target)
        hosts[index] = address
        if target == "tfjob":  # the operator's TF_CONFIG: every worker, and this pod's index
            env = {e["name"]: e.get("value") for e in container["env"]}
            tf_config = json.loads(env["TF_CONFIG"])
            assert tf_config["task"] == {"type": "worker", "index": int(index)}, tf_config
            assert [w.split(".")[0] for w in tf_config["cluster"]["worker"]] == [
                f"{name}-worker-0", f"{name}-worker-1"]  # fmt: skip
    assert set(hosts) == {"0", "1"}
    # Every pod meets at index 0's stable name, on the rendezvous port.
    (endpoint,) = endpoints
    assert endpoint.rsplit(":", 1)[0] == hosts["0"], (endpoint, hosts)
    cancel = lab.gpufleet("cancel", name, "-n", ns)
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    poll_until(
        lambda: not lab.pods(ns, name) and workload_of(lab, ns, name) is None
        and not [s for s in lab.core.list_namespaced_service(ns).items
                 if s.metadata.name.startswith(name)],
        what="no pod, workload or service of the job", timeout=60, interval=0.5,
    )  # fmt: skip


def test_a_queued_mpijob_runs_its_launcher_beside_its_workers_and_cancels_clean(
    lab: DevCluster,
) -> None:
    """The real MPI operator: Kueue admits the MPIJob, the operator creates the hostfile, the
    SSH Secret, the Service, two GPU workers and the launcher Job; the launcher (no GPU)
    schedules on the lab's GPU-only nodes (it tolerates their taint), keeps the operator's
    ConnectionAttempts, and its rendezvous host is worker 0's stable name, the hostfile's first
    line. kwok ends the launcher; the MPIJob Succeeds; cancel leaves nothing."""
    name, ns = "queued-mpi", "research"
    path = write_spec(lab.root, queued_job(name, ns, nodes=2, gpus=2), f"{name}.yaml")
    submit = lab.gpufleet("submit", str(path), "--target", "mpijob")
    assert submit.returncode == 0, submit.stderr[-2000:]

    # Workers live until the launcher ends (then the operator removes them).
    phase, pods = lab.run_to_end(name, ns)
    assert phase == "Succeeded", pods.keys()
    launcher = next(p for n, p in pods.items() if n.startswith(f"{name}-launcher-"))
    workers = [pods[f"{name}-worker-{i}"] for i in range(2)]
    for worker in workers:
        container = worker["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert container["command"][:3] == ["python", "-m", "gpufleet.launch.mpi_worker"]
        assert worker["spec"]["nodeName"].startswith("gpu-node-")
    assert "nvidia.com/gpu" not in launcher["spec"]["containers"][0]["resources"].get("limits", {})
    waited = launcher["spec"]["containers"][0]["command"]
    mpirun = waited[waited.index("--") + 1 :]
    assert mpirun[:3] == ["mpirun", "-np", "2"]
    assert any("ConnectionAttempts=10" in a for a in mpirun), mpirun
    (endpoint,) = [a.split("=", 1)[1] for a in mpirun if a.startswith("--rdzv-endpoint=")]
    worker0 = workers[0]["spec"]
    assert endpoint.rsplit(":", 1)[0] == f"{worker0['hostname']}.{worker0['subdomain']}"
    hostfile = lab.core.read_namespaced_config_map(f"{name}-config", ns).data["hostfile"]
    assert hostfile.splitlines() == [
        f"{name}-worker-{i}.{name}.{ns}.svc slots=1" for i in range(2)
    ], hostfile
    wl = workload_of(lab, ns, name)
    assert condition(wl, "Admitted"), wl
    assert wl is not None and wl["status"]["admission"]["clusterQueue"] == "research"
    cancel = lab.gpufleet("cancel", name, "-n", ns)
    assert cancel.returncode == 0, cancel.stderr[-2000:]

    def leftovers() -> list[str]:
        found = [p["metadata"]["name"] for p in lab.pods(ns, name)]
        found += ["workload"] if workload_of(lab, ns, name) else []
        core = lab.core
        for listed in (core.list_namespaced_service(ns), core.list_namespaced_config_map(ns),
                       core.list_namespaced_secret(ns)):  # fmt: skip
            found += [o.metadata.name for o in listed.items if o.metadata.name.startswith(name)]
        return found

    poll_until(lambda: not leftovers(), what="nothing of the MPIJob left", timeout=60, interval=0.5)


def test_a_gang_larger_than_the_free_quota_waits_with_no_pod_then_runs(lab: DevCluster) -> None:
    """research may use 8 GPUs (6 nominal + 2 borrowed). With 4 held by a running job, a 2 x 3
    GPU job waits, all or nothing (no pod at all), status says Kueue's reason in one line; it
    is admitted once the first job is cancelled."""
    ns = "research"
    holder = queued_job("holder", ns, nodes=1, gpus=4)
    submit_annotated(lab, holder, "job", RUN_FOR_A_DAY)  # Running until cancelled
    poll_until(
        lambda: lab.phase("holder", ns) == "Running",
        what="holder Running",
        timeout=60,
        interval=CLUSTER_POLL_S,
    )
    gang = queued_job("gang", ns, nodes=2, gpus=3)
    submit_annotated(lab, gang, "jobset", exit_with(0, after_ms=200))

    def refused() -> str:  # Kueue's verdict: QuotaReserved False, saying what is missing
        for c in (workload_of(lab, ns, "gang") or {}).get("status", {}).get("conditions", []):
            if c["type"] == "QuotaReserved" and c["status"] == "False":
                return str(c.get("message", "")) if "insufficient" in c.get("message", "") else ""
        return ""

    poll_until(refused, what="Kueue to refuse the gang for quota", timeout=60)
    time.sleep(2)  # and give it a moment more to (wrongly) admit it
    wl = workload_of(lab, ns, "gang")
    assert not condition(wl, "QuotaReserved") and not lab.pods(ns, "gang")
    status = lab.gpufleet("status", "gang", "-n", ns)
    line = next((x for x in status.stdout.splitlines() if "nvidia.com/gpu" in x), "")
    assert "research" in line and "a30" in line, status.stdout + status.stderr
    assert re.search(r"insufficient|exceed|quota", line, re.I), line
    assert lab.cancel("holder", ns)
    assert lab.wait_phase("gang", ns, "Succeeded", "Failed", timeout=120) == "Succeeded"
    assert lab.cancel("gang", ns)


def test_a_borrower_is_preempted_when_the_lender_reclaims(lab: DevCluster) -> None:
    """research borrows product's idle GPUs (8 of its 8 = 6 nominal + 2 borrowed); when product
    submits a job needing its own GPUs back, Kueue preempts research's job (reclaimWithinCohort),
    its pods end, it is requeued, and it completes once product's job is done."""
    borrower = queued_job("borrower", "research", nodes=2, gpus=4)
    submit_annotated(lab, borrower, "jobset", exit_with(0, after_ms=15000))
    poll_until(lambda: lab.phase("borrower", "research") == "Running", what="borrower Running",
               timeout=60, interval=CLUSTER_POLL_S)  # fmt: skip
    lender = queued_job("lender", "product", nodes=2, gpus=3)
    submit_annotated(lab, lender, "job", {**exit_with(0, after_ms=3000)})
    poll_until(lambda: condition(workload_of(lab, "research", "borrower"), "Evicted")
               or condition(workload_of(lab, "research", "borrower"), "Preempted"),
               what="the borrower to be preempted", timeout=60)  # fmt: skip
    status = lab.gpufleet("status", "borrower", "-n", "research")
    assert "preempted (InCohortReclamation) by a workload of ClusterQueue product" in (
        status.stdout
    ), status.stdout + status.stderr
    assert lab.wait_phase("lender", "product", "Succeeded", "Failed", timeout=120) == "Succeeded"
    assert lab.wait_phase("borrower", "research", "Succeeded", "Failed", timeout=120) == (
        "Succeeded"
    )
    for name, ns in (("lender", "product"), ("borrower", "research")):
        assert lab.cancel(name, ns)


def test_what_kueue_admits_with_borrowing_the_namespace_quota_also_allows(lab: DevCluster) -> None:
    """product borrows all 4 GPUs research lends: a 5 x 2 GPU job is admitted at 10 GPUs and
    every pod is created and runs. With the lab's old values (product's ResourceQuota 6 GPUs)
    Kueue admitted it and the quota refused 2 of its pods; the chart now refuses such values."""
    borrower = queued_job("wide", "product", nodes=5, gpus=2)
    submit_annotated(lab, borrower, "job", exit_with(0, after_ms=1000))
    assert lab.wait_phase("wide", "product", "Succeeded", "Failed", timeout=120) == "Succeeded"
    wl = workload_of(lab, "product", "wide")
    assert condition(wl, "Admitted") and wl is not None
    usage = wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert usage["nvidia.com/gpu"] == "10"
    events = lab.core.list_namespaced_event("product").items
    assert not [e for e in events if "exceeded quota" in (e.message or "")]
    assert lab.cancel("wide", "product")


# -- the Queues dashboard on the running Kueue (issue 14) -------------------------------------


# (panel, target index) of the Queues dashboard -> why it may show nothing here (it may show
# data too: an earlier test of this module has Kueue preempt a borrower).
QUEUES_MAY_BE_EMPTY = {
    ("queues.json", "Evictions and preemptions (last hour)", 0): (
        "no series until Kueue evicts a workload"
    ),
}


def metrics_reader_token(lab: DevCluster, name: str) -> str:
    """A ServiceAccount token allowed GET /metrics, as Prometheus Operator's scrape carries to a
    controller whose metrics endpoint checks TokenReview and SubjectAccessReview (Kueue's)."""
    rbac, ns = lab.typed("RbacAuthorizationV1Api"), "gpufleet-system"
    token = account_token(lab, ns, name)
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})  # fmt: skip
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    })  # fmt: skip
    return token


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_the_queues_dashboard_reads_kueue(lab: DevCluster, tmp_path: Path) -> None:
    """A real Prometheus scrapes the running Kueue (HTTPS, a ServiceAccount token, as a cluster's
    Prometheus does) while research runs one job and has another waiting for quota: every panel
    of the Queues dashboard and the per-tenant queue rules return data (issue 14)."""
    from tests.support.prometheus import panel_queries, prometheus, query, static, without_data

    (config,) = list(lab.dir.rglob("kueue-config.yaml"))
    kueue_metrics = yaml.safe_load(config.read_text())["metrics"]
    assert kueue_metrics["enableClusterQueueResources"] is True
    name, ns = "queues-dashboard-test", "research"
    token = tmp_path / "token"
    token.write_text(metrics_reader_token(lab, name))
    # as in the gang test: 4 of research's GPUs held, a 2 x 3 GPU gang waits for quota
    submit_annotated(lab, queued_job("holder", ns, nodes=1, gpus=4), "job", RUN_FOR_A_DAY)
    poll_until(
        lambda: lab.phase("holder", ns) == "Running",
        what="holder Running",
        timeout=60,
        interval=CLUSTER_POLL_S,
    )
    submit_annotated(lab, queued_job("waiter", ns, nodes=2, gpus=3), "jobset", RUN_FOR_A_DAY)
    # Kueue serves its metrics with a certificate it made itself
    scrape = static("kueue", kueue_metrics["bindAddress"], scheme="https",
                    tls_config={"insecure_skip_verify": True},
                    authorization={"credentials_file": str(token)})  # fmt: skip
    queries = panel_queries([REPO / "deploy" / "grafana" / "queues.json"])
    queries[("rules", "tenant:kueue_pending_workloads:sum", 0)] = (
        'tenant:kueue_pending_workloads:sum{tenant="research"} > 0'
    )
    queries[("rules", "tenant:kueue_quota_usage:ratio", 0)] = (
        'tenant:kueue_quota_usage:ratio{tenant="research",resource="nvidia.com/gpu"} > 0'
    )
    try:
        with prometheus(tmp_path, [scrape]) as port:
            empty = without_data(port, queries, set(QUEUES_MAY_BE_EMPTY), timeout=120)
            up = query(port, 'up{job="kueue"}')
        assert set(empty) <= set(QUEUES_MAY_BE_EMPTY), (empty, up)
    finally:
        for job in ("holder", "waiter"):
            lab.gpufleet("cancel", job, "-n", ns)
        rbac = lab.typed("RbacAuthorizationV1Api")
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
        lab.core.delete_namespaced_service_account(name, "gpufleet-system")
