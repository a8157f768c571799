"""The platform on the real controllers (issue 11, items 3a-3d): the chart installed with every
ci/ values file and accepted by Kueue, queued jobs admitted by Kueue and run by the Job and JobSet
controllers on kwok's GPU nodes, gangs that wait for quota, and cohort borrowing with preemption.

All on the session's local cluster (tests/support/devcluster.py: 3 nodes x 4 A30, the chart's lab).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.kwok import RUN_FOR_A_DAY, exit_with
from gpufleet.kube import Obj
from tests.support.chart import expected_namespaces
from tests.support.devcluster import (
    CHART,
    DevCluster,
    condition,
    needs_controlplane,
    tenant_user,
    workload_of,
)
from tests.support.paths import REPO
from tests.support.procs import poll_until
from tests.support.specs import cluster_job, pod_templates, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, needs_controlplane]
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def values_of(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def active(obj: dict[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)


def release_objects(cluster: DevCluster, release: str) -> list[str]:
    """Every object the chart's labels tie to ``release`` that is still in the API (cluster-
    scoped kinds and the tenants' namespaced kinds)."""
    selector = f"app.kubernetes.io/instance={release}"
    found = []
    for plural in ("resourceflavors", "clusterqueues", "workloadpriorityclasses", "topologies"):
        listed = cluster.custom.list_cluster_custom_object(*KUEUE, plural, label_selector=selector)
        found += [f"{plural}/{o['metadata']['name']}" for o in listed["items"]]
    listed = cluster.custom.list_cluster_custom_object(*KUEUE, "localqueues",
                                                       label_selector=selector)  # fmt: skip
    found += [f"localqueues/{o['metadata']['name']}" for o in listed["items"]]
    for n in cluster.core.list_namespace(label_selector=selector).items:
        found.append(f"namespaces/{n.metadata.name}")
    rbac, storage = cluster.typed("RbacAuthorizationV1Api"), cluster.typed("StorageV1Api")
    for kind, listed in (
        ("clusterroles", rbac.list_cluster_role(label_selector=selector)),
        ("clusterrolebindings", rbac.list_cluster_role_binding(label_selector=selector)),
        ("storageclasses", storage.list_storage_class(label_selector=selector)),
    ):
        found += [f"{kind}/{o.metadata.name}" for o in listed.items]
    return found


def namespaces(cluster: DevCluster, *names: str) -> list[str]:
    """Those of ``names`` that still exist (a Terminating namespace still does)."""
    return [n.metadata.name for n in cluster.core.list_namespace().items
            if n.metadata.name in names]  # fmt: skip


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))
def test_chart_installs_is_accepted_by_kueue_and_uninstalls_clean(
    devcluster: DevCluster, values: Path
) -> None:
    release, ns = "gf-ci", "gpufleet-ci"
    for namespace in expected_namespaces(values):  # its Alertmanager's, its mirror's
        devcluster.ensure_namespace(namespace)
    installed = devcluster.helm("install", release, str(CHART), "-f", str(values), "-n", ns,
                                "--create-namespace", "--wait", "--timeout", "120s",
                                check=False)  # fmt: skip
    try:
        assert installed.returncode == 0, installed.stderr[-3000:]
        tenants = [t["name"] for t in values_of(values)["tenants"]]

        def queues_active() -> bool:
            cqs = devcluster.custom.list_cluster_custom_object(
                *KUEUE, "clusterqueues", label_selector=f"app.kubernetes.io/instance={release}"
            )["items"]
            ours = {q["metadata"]["name"]: active(q) for q in cqs}
            lqs = [devcluster.custom.get_namespaced_custom_object(*KUEUE, t, "localqueues", t)
                   for t in tenants]  # fmt: skip
            return len(ours) == len(tenants) and all(ours.values()) and all(map(active, lqs))

        poll_until(queues_active, what="every ClusterQueue and LocalQueue Active", timeout=60)
        rdma = {t["name"] for t in values_of(values)["tenants"] if t.get("rdma")}
        for tenant in tenants:
            labels = devcluster.core.read_namespace(tenant).metadata.labels
            # an RDMA tenant: the chart's policy holds it to restricted plus IPC_LOCK instead
            level = "privileged" if tenant in rdma else "restricted"
            assert labels["pod-security.kubernetes.io/enforce"] == level
            assert (labels.get("gpufleet.dev/rdma") == "true") == (tenant in rdma)
    finally:
        # Also after a failed install: helm keeps a failed release and what it had created,
        # which would break the next test's install.
        devcluster.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s",
                        check=installed.returncode == 0)  # fmt: skip
    devcluster.core.delete_namespace(ns)
    poll_until(lambda: not release_objects(devcluster, release) and not namespaces(devcluster, ns),
               timeout=120, interval=1,
               what="every object of the release (namespaces included) to be gone")  # fmt: skip


def test_contradictory_values_are_refused_before_anything_is_applied(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    values = values_of(CHART / "ci" / "lab-3node-a30-values.yaml")
    values["tenants"][0]["queue"]["flavors"][0]["name"] = "h100"  # no such flavor
    bad = tmp_path / "bad-values.yaml"
    bad.write_text(yaml.safe_dump(values))
    proc = devcluster.helm("install", "gf-bad", str(CHART), "-f", str(bad), "-n", "gf-bad",
                           check=False)  # fmt: skip
    assert proc.returncode != 0
    assert 'tenants[0].queue.flavors[0].name: flavor "h100" is not defined' in proc.stderr
    assert not release_objects(devcluster, "gf-bad")
    assert not namespaces(devcluster, "gf-bad", *(t["name"] for t in values["tenants"]))


# -- queued jobs on the lab's queues ----------------------------------------------------------


@pytest.fixture(scope="module")
def lab(devcluster: DevCluster) -> Iterator[DevCluster]:
    """The chart installed with the 3-node A30 lab's values (tenants research and product in
    cohort "lab"), uninstalled after this module."""
    values = CHART / "ci" / "lab-3node-a30-values.yaml"
    devcluster.helm("install", "lab", str(CHART), "-f", str(values), "-n", "gpufleet-system",
                    "--create-namespace", "--wait", "--timeout", "120s")  # fmt: skip
    try:
        poll_until(
            lambda: all(active(devcluster.custom.get_cluster_custom_object(
                *KUEUE, "clusterqueues", t)) for t in ("research", "product")),
            what="the lab's ClusterQueues Active", timeout=60,
        )  # fmt: skip
        yield devcluster
    finally:
        devcluster.helm("uninstall", "lab", "-n", "gpufleet-system", "--wait")
        devcluster.core.delete_namespace("gpufleet-system")
        poll_until(lambda: not release_objects(devcluster, "lab")
                   and not namespaces(devcluster, "gpufleet-system"),
                   timeout=120, interval=1, what="the lab release to be gone")  # fmt: skip


def queued_job(name: str, tenant: str, nodes: int, gpus: int, target: str | None = None,
               **spec: Any) -> dict[str, Any]:  # fmt: skip
    """A queued digits job of ``tenant``, its checkpoints in S3; for a TensorFlow or Ray
    target, on the volume cluster_job names (they write to a filesystem: bound_claim makes
    it)."""
    where: dict[str, Any] = {"checkpoint": {"dir": "s3://bucket/ckpt"}, "volumes": []}
    if target in ("tfjob", "rayjob"):
        where = {}
    doc = cluster_job(target=target, nodes=nodes, procsPerNode=gpus, resources={"gpu": gpus},
                      queue=tenant, **where, **spec)  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": tenant}
    return doc


def bound_claim(cluster: DevCluster, namespace: str, claim: str) -> None:
    """A PersistentVolumeClaim bound to a static PersistentVolume made for it (kwok's pods
    mount nothing; the scheduler only wants the claim bound)."""
    volume = f"{namespace}-{claim}"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                   "storageClassName": "", "hostPath": {"path": f"/tmp/{namespace}-{claim}"},
                   "claimRef": {"namespace": namespace, "name": claim}}}  # fmt: skip
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    cluster.core.create_persistent_volume(pv)
    cluster.core.create_namespaced_persistent_volume_claim(namespace, pvc)
    poll_until(lambda: cluster.core.read_namespaced_persistent_volume_claim(claim, namespace)
               .status.phase == "Bound", what=f"claim {claim} bound", timeout=60)  # fmt: skip


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
    poll_until(lambda: lab.phase("holder", ns) == "Running", what="holder Running", timeout=60)
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
    assert lab.gpufleet("cancel", "holder", "-n", ns).returncode == 0
    assert lab.wait_phase("gang", ns, "Succeeded", "Failed", timeout=120) == "Succeeded"
    assert lab.gpufleet("cancel", "gang", "-n", ns).returncode == 0


def test_a_borrower_is_preempted_when_the_lender_reclaims(lab: DevCluster) -> None:
    """research borrows product's idle GPUs (8 of its 8 = 6 nominal + 2 borrowed); when product
    submits a job needing its own GPUs back, Kueue preempts research's job (reclaimWithinCohort),
    its pods end, it is requeued, and it completes once product's job is done."""
    borrower = queued_job("borrower", "research", nodes=2, gpus=4)
    submit_annotated(lab, borrower, "jobset", exit_with(0, after_ms=15000))
    poll_until(lambda: lab.phase("borrower", "research") == "Running", what="borrower Running",
               timeout=60)  # fmt: skip
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
        assert lab.gpufleet("cancel", name, "-n", ns).returncode == 0


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
    assert lab.gpufleet("cancel", "wide", "-n", "product").returncode == 0


# -- tenancy and security (item 3f), serving (3g) ----------------------------------------------


def every_client_object(ns: str) -> list[Obj]:
    """What gpufleet's client creates for a tenant: every training target (with a PodMonitor),
    the kept logs' reader pod, and every serving target, autoscaled by HPA and by KEDA."""
    from gpufleet.cluster.keptlogs import reader_pod
    from gpufleet.render import SERVING_TARGETS, TARGETS, render, render_spec
    from gpufleet.spec import validate_spec, validate_training_job

    objects = []
    for target in TARGETS:
        if target != "trainjob":
            doc = queued_job("every", ns, nodes=2, gpus=1, target=target,
                             metrics={"port": 9090, "podMonitor": True})  # fmt: skip
            objects += render(validate_training_job(doc), target)
    # A TrainJob cannot declare the metrics port (render/checks.py)
    objects += render(validate_training_job(queued_job("every", ns, nodes=2, gpus=1)), "trainjob")
    # `gpufleet logs` of a job whose pods are gone: a reader pod, created and deleted
    objects.append(reader_pod(next(o for o in objects if o["kind"] == "Job")))
    serving = yaml.safe_load((CHART.parents[2] / "examples" / "digits-serving.yaml").read_text())
    serving["metadata"]["namespace"] = ns
    for engine in ("hpa", "keda"):
        serving["spec"]["autoscaling"]["engine"] = engine
        for target in SERVING_TARGETS:
            doc = serving
            if target == "kserve":  # KServe serves from a PVC only and scales on in-flight
                # requests (render/serving.py kserve_errors)
                model = {"name": serving["spec"]["model"]["name"], "pvc": {"claimName": "models"}}
                scaling = {**serving["spec"]["autoscaling"], "metric": "inflight"}
                doc = {**serving, "spec": {**serving["spec"], "model": model,
                                           "autoscaling": scaling}}  # fmt: skip
            objects += render_spec(validate_spec(doc), target)
    return objects


def allowed(cluster: DevCluster, user: str, group: str, ns: str, verb: str, obj: Obj) -> bool:
    """RBAC's answer (a SubjectAccessReview) for ``user`` in ``group`` doing ``verb`` on
    ``obj``'s kind in ``ns``; it needs no CRD installed (PyTorchJob, InferenceService, ...)."""
    group_name = obj["apiVersion"].rpartition("/")[0]
    review = {
        "spec": {
            "user": user,
            "groups": [group, "system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": verb, "group": group_name,
                                   "resource": obj["kind"].lower() + "s"},
        }
    }  # fmt: skip
    answer = cluster.typed("AuthorizationV1Api").create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_a_tenant_member_may_do_what_the_client_does_in_its_namespace_only(lab: DevCluster) -> None:
    """Every kind the client creates, gets, lists and deletes (training targets, PodMonitor,
    serving with HPA or KEDA, KServe): allowed to research's members in research, refused in
    product; the other tenant's pods cannot be read."""
    kinds = {(o["apiVersion"], o["kind"]): o for o in every_client_object("research")}
    assert {k for _, k in kinds} >= {"Job", "JobSet", "PyTorchJob", "TFJob", "TrainJob", "MPIJob",
        "Pod", "PodMonitor", "Deployment", "Service", "PodDisruptionBudget",
        "HorizontalPodAutoscaler", "ScaledObject", "InferenceService"}  # fmt: skip
    missing = [f"{verb} {kind}" for (_, kind), obj in sorted(kinds.items())
               for verb in ("create", "get", "list", "delete")
               if not allowed(lab, "bob", "research", "research", verb, obj)]  # fmt: skip
    assert not missing, f"the gpufleet-user Role lacks: {missing}"
    leaks = [f"{verb} {kind}" for (_, kind), obj in sorted(kinds.items())
             for verb in ("create", "get", "delete")
             if allowed(lab, "bob", "research", "product", verb, obj)]  # fmt: skip
    assert not leaks, f"a research member may act in product: {leaks}"


def test_serving_submitted_by_a_tenant_user_lands_on_gpu_nodes(lab: DevCluster) -> None:
    """`gpufleet submit examples/digits-serving.yaml` as a member of product (a client
    certificate, not the admin): Deployment, Service, PDB and HPA created; its pods pass
    `restricted`, run on GPU nodes; cancel removes them."""
    env = tenant_user(lab, "carol", "product")
    doc = yaml.safe_load((CHART.parents[2] / "examples" / "digits-serving.yaml").read_text())
    doc["metadata"]["namespace"] = "product"
    submit = lab.gpufleet_as(env, "submit", str(write_spec(lab.root, doc, "serving.yaml")))
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert "HorizontalPodAutoscaler/digits" in submit.stdout + submit.stderr

    def running() -> list[dict[str, Any]]:
        pods = [p for p in lab.pods("product") if p["metadata"]["name"].startswith("digits-")]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    pods = poll_until(running, what="the serving pods Running", timeout=90, interval=1)
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
    status = lab.gpufleet_as(env, "status", "digits", "-n", "product")
    assert status.returncode == 0 and "digits" in status.stdout, status.stderr
    cancel = lab.gpufleet_as(env, "cancel", "digits", "-n", "product")
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    apps = lab.typed("AppsV1Api")
    assert not [d for d in apps.list_namespaced_deployment("product").items
                if d.metadata.name == "digits"]  # fmt: skip


def restricted_violation() -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip


def test_every_rendered_pod_passes_restricted_and_others_are_refused(lab: DevCluster) -> None:
    """Every pod template gpufleet renders (all targets, serving included), created as a Pod in a
    tenant namespace that enforces `restricted`, is admitted (server dry run); a pod without the
    restricted settings and a privileged one are refused by the API server."""
    from kubernetes.client.exceptions import ApiException

    refused = []
    for obj in every_client_object("research"):
        if obj["kind"] == "TrainJob":  # its templates are patches onto the Trainer's runtime
            continue
        for i, template in enumerate(pod_templates(obj)):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"probe-{obj['kind'].lower()}-{i}"},
                   "spec": template["spec"]}  # fmt: skip
            try:
                lab.core.create_namespaced_pod("research", pod, dry_run="All")
            except ApiException as exc:
                refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.body[:300]}")
    assert not refused, refused
    with pytest.raises(ApiException) as loose:
        lab.core.create_namespaced_pod("research", restricted_violation(), dry_run="All")
    assert loose.value.status == 403
    assert 'violates PodSecurity "restricted' in json.loads(loose.value.body)["message"]
    privileged = restricted_violation()
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as priv:
        lab.core.create_namespaced_pod("research", privileged, dry_run="All")
    assert priv.value.status in (403, 422), priv.value.body


def test_a_pytorchjob_with_a_master_gets_its_workers_refused_by_restricted(lab: DevCluster) -> None:
    """Why gpufleet renders PyTorchJob Workers only: with a Master, the real training-operator
    adds its `init-pytorch` container (no securityContext) to every Worker, and `restricted`
    refuses those pods. `gpufleet status` says so in one line (the operator's FailedCreatePod
    event), instead of a job that waits forever."""
    from gpufleet.cluster import Cluster
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    name, ns = "with-master", "research"
    (job,) = render(validate_training_job(queued_job(name, ns, nodes=2, gpus=1)), "pytorchjob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    replicas["Worker"]["replicas"] = 1
    replicas["Master"] = copy.deepcopy(replicas["Worker"])
    for spec in replicas.values():  # the Master keeps running (kwok would end it)
        meta = spec["template"].setdefault("metadata", {})
        meta["annotations"] = {**meta.get("annotations", {}), **RUN_FOR_A_DAY}
    Cluster(lab.custom, lab.core, ns).submit([job])
    try:

        def refusal() -> str:
            st = lab.gpufleet("status", name, "-n", ns)
            return st.stdout if "init-pytorch" in st.stdout else ""

        out = poll_until(refusal, what="status to report the refused Worker", timeout=60)
        line = next(ln for ln in out.splitlines() if "init-pytorch" in ln)
        assert "cannot create pods" in line and 'violates PodSecurity "restricted' in line, out
        pods = lab.pods(ns, name)
        assert [p["metadata"]["name"] for p in pods] == [f"{name}-master-0"], pods
    finally:
        assert lab.gpufleet("cancel", name, "-n", ns).returncode == 0
        poll_until(lambda: not lab.pods(ns, name), what="the pods gone", timeout=60)


def test_the_namespace_resource_quota_is_enforced(lab: DevCluster) -> None:
    """A pod asking for more GPUs than research's ResourceQuota (8) is refused by admission."""
    from kubernetes.client.exceptions import ApiException

    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    job = render(validate_training_job(queued_job("greedy", "research", nodes=1, gpus=1)), "job")
    template = next(pod_templates(job[-1]))
    spec = copy.deepcopy(template["spec"])
    spec["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "9"},
                                          "limits": {"nvidia.com/gpu": "9"}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "greedy"}, "spec": spec}
    with pytest.raises(ApiException) as exceeded:
        lab.core.create_namespaced_pod("research", pod, dry_run="All")
    assert exceeded.value.status == 403
    assert "exceeded quota: gpufleet-quota" in json.loads(exceeded.value.body)["message"]


# -- names the controllers derive (item 4) ------------------------------------------------------


@pytest.mark.parametrize("target", ["job", "jobset"])
def test_a_name_at_the_targets_limit_runs_and_one_more_is_refused(
    devcluster: DevCluster, target: str
) -> None:
    """The longest name `gpufleet validate --target` accepts runs on the real controllers (pods
    and hostnames valid); one character more is refused by validate with the limit, where before
    the JobSet webhook refused it after gpufleet had accepted it."""
    from kubernetes.client.exceptions import ApiException

    from gpufleet.render import render
    from gpufleet.render.checks import name_limit
    from gpufleet.spec import validate_training_job

    ns = f"names-{target}"
    if ns not in namespaces(devcluster, ns):
        devcluster.namespace(ns)
    limit = name_limit(target, 2)
    name = "n" * limit
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1}, checkpoint={"dir": "s3://b/c"},
                      volumes=[])  # fmt: skip
    doc["metadata"] = {"name": name, "namespace": ns}
    path = write_spec(devcluster.root, doc, f"{target}-limit.yaml")
    assert devcluster.gpufleet("validate", str(path), "--target", target).returncode == 0
    submit = devcluster.gpufleet("submit", str(path), "--target", target)
    assert submit.returncode == 0, submit.stderr[-2000:]
    assert devcluster.wait_phase(name, ns, "Succeeded", "Failed") == "Succeeded"
    assert len(devcluster.pods(ns, name)) == 2
    assert devcluster.gpufleet("cancel", name, "-n", ns).returncode == 0
    doc["metadata"]["name"] = name + "n"
    longer = write_spec(devcluster.root, doc, f"{target}-over.yaml")
    refused = devcluster.gpufleet("validate", str(longer), "--target", target)
    assert refused.returncode == 2 and f"use at most {limit} characters" in refused.stderr
    if target == "jobset":  # the webhook agrees: one more character is one too many
        at_limit = {**doc, "metadata": {"name": name, "namespace": ns}}
        (jobset,) = render(validate_training_job(at_limit), target)
        jobset["metadata"]["name"] = name + "n"
        with pytest.raises(ApiException) as webhook:
            devcluster.custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", jobset, dry_run="All"
            )
        message = json.loads(webhook.value.body)["message"]
        assert 'admission webhook "vjobset.kb.io" denied' in message
        assert "pod names generated for this JobSet will exceed 63 characters" in message


# -- bad input against the live server (item 3h) --------------------------------------------------


def test_bad_input_on_the_live_server_is_one_line_and_leaves_nothing(lab: DevCluster) -> None:
    """A missing LocalQueue (exit 2, nothing created), an object refused by admission after
    another was created (exit 1 with the server's reason; the first removed again), an expired
    client certificate (exit 1, unauthorized): one line each, no traceback."""
    import datetime

    from gpufleet.devcluster.pki import Pki, issue, write_kubeconfig
    from gpufleet.devcluster.state import State

    lost = queued_job("lost", "research", nodes=1, gpus=1)
    lost["spec"]["queue"] = "nope"
    r = lab.gpufleet("submit", str(write_spec(lab.root, lost, "lost.yaml")), "--target", "jobset")
    assert r.returncode == 2, r.stderr
    assert "no LocalQueue 'nope' in namespace research (queues there: research)" in r.stderr
    assert (
        "Traceback" not in r.stderr and lab.gpufleet("status", "lost", "-n", "research").returncode
    )

    ns = lab.namespace("no-jobs-allowed")
    quota = {"metadata": {"name": "no-jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}}
    lab.core.create_namespaced_resource_quota(ns, quota)
    poll_until(lambda: lab.core.read_namespaced_resource_quota("no-jobs", ns).status.hard,
               what="the quota to be counted", timeout=30)  # fmt: skip
    doc = cluster_job(nodes=2, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "refused", "namespace": ns}
    r = lab.gpufleet("submit", str(write_spec(lab.root, doc, "refused.yaml")))
    assert r.returncode == 1, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error")]
    assert len(error) == 1 and "exceeded quota: no-jobs" in error[0], r.stderr
    assert "removed again: Service/refused" in error[0]
    assert not lab.core.list_namespaced_service(ns).items

    pki = Pki(lab.dir / "pki")
    yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    issue(pki, "user-expired", "dave", ["research"], not_after=yesterday)
    state = State.read(lab.dir)
    assert state is not None
    config = write_kubeconfig(lab.root / "expired.kubeconfig", state.server, pki, "user-expired")
    r = lab.gpufleet_as(lab.env | {"KUBECONFIG": str(config)}, "status", "anything", "-n",
                        "research")  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "unauthorized (expired or unknown credentials" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_field_the_server_does_not_know_is_refused_not_dropped(devcluster: DevCluster) -> None:
    """Submit uses strict field validation: a field the installed CRD lacks (TrainJob's
    runtimePatches on a Trainer older than v2.2.0, here a JobSet field from the future) fails
    the submit in one line instead of vanishing."""
    from gpufleet.cluster import Cluster, ClusterError
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    ns = "strict-fields"
    if ns not in namespaces(devcluster, ns):
        devcluster.namespace(ns)
    doc = cluster_job(nodes=1, procsPerNode=1, resources={"gpu": 1},
                      checkpoint={"dir": "s3://b/c"}, volumes=[])  # fmt: skip
    doc["metadata"] = {"name": "future", "namespace": ns}
    (jobset,) = render(validate_training_job(doc), "jobset")
    jobset["spec"]["runtimePatches"] = [{"manager": "gpufleet"}]
    with pytest.raises(ClusterError) as refused:
        Cluster(devcluster.custom, devcluster.core, ns).submit([jobset])
    assert 'unknown field "spec.runtimePatches"' in str(refused.value)
    assert "\n" not in str(refused.value)


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
    from kubernetes import client

    rbac, ns = lab.typed("RbacAuthorizationV1Api"), "gpufleet-system"
    lab.core.create_namespaced_service_account(ns, {"metadata": {"name": name}})
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})  # fmt: skip
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    })  # fmt: skip
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    return str(lab.core.create_namespaced_service_account_token(name, ns, request).status.token)


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
    poll_until(lambda: lab.phase("holder", ns) == "Running", what="holder Running", timeout=60)
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
