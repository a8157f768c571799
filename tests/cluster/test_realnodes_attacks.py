"""Tenants on the real nodes, attacked (issue 55, item 6; the network half was issue 29's
test_realnodes_netpol): tenant B (research) runs a job across both nodes; tenant A (product)
attacks it and the platform, as A's user through the API server (the chart's RoleBinding of A's
group, by impersonation), from A's pods and with A's object store credentials. Every attack is
a row naming the layer expected to refuse it and the layer that did, from the refusal itself;
the matrix is written to benchmarks/results/tenant-attack-matrix.md and every row must hold.

What must stay open stays open: B's own pods reach the job's rendezvous and metrics ports and
resolve its pods' and the API server's names; the monitoring namespace scrapes its metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.realnodes.configs import KUBELET_PORT
from gpufleet.devcluster.realnodes.network import HOST_IP
from gpufleet.devcluster.state import State
from gpufleet.render.podspec import RDZV_PORT
from gpufleet.runtime.metrics import STEP
from tests.support import attacks
from tests.support.attacks import Row, attempt
from tests.support.devcluster import CLUSTER_POLL_S, DevCluster
from tests.support.paths import REPO
from tests.support.probes import OPEN, REFUSED, enforced_for, namespace, probe
from tests.support.procs import poll_until
from tests.support.realnodes import CLAIM, TENANT, pod_log, real_job, running_pod, submit
from tests.support.s3 import VERSITYGW, versitygw

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(600)]  # fmt: skip
ATTACKER = "product"  # the lab's other tenant, its group's member "mallory"
MONITORING = "monitoring"  # the chart's networkPolicy.monitoringNamespace
OUTSIDE = "netpol-outside"  # no network policy at all
METRICS_PORT = 9411
MATRIX = REPO / "benchmarks" / "results" / "tenant-attack-matrix.md"
NAME = "victim"


@pytest.fixture(scope="module")
def matrix(reallab: DevCluster) -> Iterator[list[Row]]:
    """The rows the tests below add; written as the matrix once all have run."""
    rows: list[Row] = []
    yield rows
    from kubernetes import client

    version = client.VersionApi(reallab.api).get_code().git_version
    # the victim's pod names are the run's own: the table stays the same from run to run
    stable = [replace(r, message=re.sub(rf"{NAME}-(\d)-[a-z0-9]{{5}}", rf"{NAME}-\1-…", r.message))
              for r in rows]  # fmt: skip
    attacks.write_table(stable, MATRIX, [
        "Made by tests/cluster/test_realnodes_attacks.py on `gpufleet cluster up --real-nodes 2`",
        f"(Kubernetes {version} built here, kube-router's network policies, the chart with its",
        f"lab values): tenant A is `{ATTACKER}`, tenant B `{TENANT}`.",
    ])  # fmt: skip


@pytest.fixture(scope="module")
def victim(reallab: DevCluster) -> Iterator[dict[str, Any]]:
    """B's job, training on both nodes, its policies in place: pod 0."""
    doc = real_job(NAME, 2, 1)
    doc["spec"]["workload"] = {"name": "digits", "steps": 100000, "logEvery": 100}
    doc["spec"]["checkpoint"]["everySteps"] = 1000
    doc["spec"]["metrics"] = {"port": METRICS_PORT}
    submit(reallab, doc)
    try:
        poll_until(lambda: all(running_pod(reallab, NAME, i) for i in (0, 1)),
                   what="both pods running", timeout=300)  # fmt: skip
        pod_0 = running_pod(reallab, NAME, 0)
        assert pod_0 is not None
        poll_until(lambda: "step " in pod_log(reallab, pod_0["metadata"]["name"]),
                   what="a step: the two pods rendezvoused", timeout=300,
                   interval=CLUSTER_POLL_S)  # fmt: skip
        poll_until(lambda: enforced_for(reallab, pod_0), what="pod 0's policies", timeout=60)
        yield pod_0
    finally:
        assert reallab.cancel(NAME, TENANT)


def test_bs_own_pods_and_monitoring_reach_what_they_must(
    reallab: DevCluster, victim: dict[str, Any]
) -> None:
    address = victim["status"]["podIP"]
    ports = [[address, RDZV_PORT], [address, METRICS_PORT]]
    pod_0_name = f"{NAME}-0.{NAME}.{TENANT}.svc.cluster.local"
    api = "kubernetes.default.svc.cluster.local"
    seen = probe(reallab, TENANT, "peer", {"connect": ports, "resolve": [pod_0_name, api]})
    assert seen[f"{address}:{RDZV_PORT}"] == seen[f"{address}:{METRICS_PORT}"] == OPEN, seen
    assert seen[pod_0_name] == address and seen[api], seen
    namespace(reallab, MONITORING)
    scrape = f"http://{address}:{METRICS_PORT}/metrics"
    seen = probe(reallab, MONITORING, "scraper", {"connect": ports[1:], "scrape": scrape})
    assert any(line.startswith(STEP) for line in seen["scraped"]), seen


def test_as_pods_reach_none_of_bs_ports_nor_the_platforms(
    reallab: DevCluster, victim: dict[str, Any], matrix: list[Row]
) -> None:
    """From A's pod (and from a namespace with no policy): B's rendezvous and metrics ports
    (open to B's own pods, above), each node's kubelet, etcd on the API server's host, and the
    API server itself without a token."""
    address = victim["status"]["podIP"]
    state = State.read(reallab.dir)
    assert state is not None
    etcd = [HOST_IP, state.ports["etcd"]]
    api = f"https://{HOST_IP}:{state.ports['kube-apiserver']}/api/v1/namespaces/{TENANT}/secrets"
    nodes = {n.metadata.name: next(a.address for a in n.status.addresses if a.type == "InternalIP")
             for n in reallab.core.list_node().items}  # fmt: skip
    kubelets = {name: f"https://{ip}:{KUBELET_PORT}/pods" for name, ip in nodes.items()}
    want = {"connect": [[address, RDZV_PORT], [address, METRICS_PORT], etcd,
                        *([ip, KUBELET_PORT] for ip in nodes.values())],
            "fetch": [api, *kubelets.values()]}  # fmt: skip
    seen = probe(reallab, ATTACKER, "intruder", want)
    rows: list[Row] = []
    for port, what in ((RDZV_PORT, "rendezvous (c10d store)"), (METRICS_PORT, "metrics")):
        met = seen[f"{address}:{port}"]
        rows.append(Row(f"A's pod connects to B's pod 0 {what} port {port}", attacks.NETPOL,
                          attacks.NETPOL if met != OPEN else "", f"connection: {met}"))  # fmt: skip
    for name, ip in nodes.items():
        met, answer = seen[f"{ip}:{KUBELET_PORT}"], seen[kubelets[name]]
        by = attacks.NETPOL if met != OPEN else (attacks.KUBELET if answer[:3] == "401" else "")
        said = f"connection: {met}; GET /pods: {answer}"
        rows.append(
            Row(
                f"A's pod calls node {name}'s kubelet API ({ip}:{KUBELET_PORT})",
                attacks.NETPOL,
                by,
                said,
            )
        )
    met = seen[f"{HOST_IP}:{state.ports['etcd']}"]
    rows.append(Row(f"A's pod connects to etcd (its port, on the API server's host {HOST_IP})",
                      "etcd on 127.0.0.1 only", "etcd on 127.0.0.1 only" if met == REFUSED else "",
                      f"connection: {met}"))  # fmt: skip
    answer = seen[api]  # anonymous: the API server takes it as system:anonymous, which RBAC
    anonymous = answer[:3] == "403" and "system:anonymous" in answer  # grants nothing here
    rows.append(
        Row(
            "A's pod lists B's Secrets on the API server with no token",
            attacks.RBAC,
            attacks.RBAC if anonymous else "",
            f"GET: {attacks.message_of(answer)}",
        )
    )
    # From a namespace without policies: B's own ingress policy still refuses it; the kubelet
    # is reachable there, so above it was A's egress policy that refused, and here the
    # kubelet's own authentication does.
    namespace(reallab, OUTSIDE)
    name, ip = sorted(nodes.items())[0]
    seen = probe(reallab, OUTSIDE, "outsider", {"connect": want["connect"][:1],
                                                "fetch": [kubelets[name]]})  # fmt: skip
    met = seen[f"{address}:{RDZV_PORT}"]
    rows.append(Row("a pod of a namespace without policies connects to B's rendezvous port",
                    attacks.NETPOL, attacks.NETPOL if met != OPEN else "",
                    f"connection: {met}"))  # fmt: skip
    answer = seen[kubelets[name]]
    rows.append(Row(f"a pod of a namespace without policies calls node {name}'s kubelet API",
                    attacks.KUBELET, attacks.KUBELET if answer[:3] == "401" else "",
                    f"GET /pods: {answer}"))  # fmt: skip
    matrix += rows
    assert all(r.held for r in rows), [r for r in rows if not r.held]


def test_as_user_reads_and_changes_nothing_of_bs_nor_the_platforms(
    reallab: DevCluster, victim: dict[str, Any], matrix: list[Row]
) -> None:
    """A's user, with the chart's RoleBinding of A's group: RBAC refuses B's objects, A's own
    namespace's guards, and the platform's; and the chart's policy the priorities and volumes
    A may not take. Each create is a dry run: one that got through would leave nothing."""
    from kubernetes import client

    api = attacks.impersonating(reallab, "mallory", ATTACKER)
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    custom, rbac = client.CustomObjectsApi(api), client.RbacAuthorizationV1Api(api)
    pod_0 = victim["metadata"]["name"]
    exec_path = f"/api/v1/namespaces/{TENANT}/pods/{pod_0}/exec"
    kueue = ("kueue.x-k8s.io", "v1beta2")
    rows = [attempt(*a) for a in (
        ("A's user lists B's pods", attacks.RBAC, lambda: core.list_namespaced_pod(TENANT)),
        ("A's user reads B's pod 0's log", attacks.RBAC,
         lambda: core.read_namespaced_pod_log(pod_0, TENANT)),
        ("A's user execs into B's pod 0", attacks.RBAC,
         lambda: attacks.raw(api, "POST", exec_path, [("command", "id"), ("stdout", "true")])),
        ("A's user creates a pod in B", attacks.RBAC,
         lambda: core.create_namespaced_pod(TENANT, attacks.pod("intruder"), dry_run="All")),
        ("A's user lists B's Secrets", attacks.RBAC, lambda: core.list_namespaced_secret(TENANT)),
        ("A's user lists B's ConfigMaps", attacks.RBAC,
         lambda: core.list_namespaced_config_map(TENANT)),
        ("A's user lists B's claims", attacks.RBAC,
         lambda: core.list_namespaced_persistent_volume_claim(TENANT)),
        ("A's user lists B's Jobs", attacks.RBAC, lambda: batch.list_namespaced_job(TENANT)),
        ("A's user lists B's Kueue Workloads", attacks.RBAC,
         lambda: custom.list_namespaced_custom_object(*kueue, TENANT, "workloads")),
        ("A's user reads Sealed Secrets' private keys (kube-system)", attacks.RBAC,
         lambda: core.list_namespaced_secret("kube-system")),
        ("A's user makes a LocalQueue in A pointing to B's ClusterQueue", attacks.RBAC,
         lambda: custom.create_namespaced_custom_object(*kueue, ATTACKER, "localqueues", {
             "apiVersion": "/".join(kueue), "kind": "LocalQueue",
             "metadata": {"name": "borrowed"}, "spec": {"clusterQueue": TENANT}},
             dry_run="All")),
        ("A's user raises A's ClusterQueue's quota", attacks.RBAC,
         lambda: custom.patch_cluster_custom_object(*kueue, "clusterqueues", ATTACKER,
                                                    {"spec": {"cohort": "mine"}})),
        ("A's user binds itself cluster-admin in A", attacks.RBAC,
         lambda: rbac.create_namespaced_role_binding(ATTACKER, {
             "metadata": {"name": "mine"}, "subjects": [
                 {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}],
             "roleRef": {"kind": "ClusterRole", "name": "cluster-admin",
                         "apiGroup": "rbac.authorization.k8s.io"}}, dry_run="All")),
        ("A's user relabels A's namespace Pod Security privileged", attacks.RBAC,
         lambda: core.patch_namespace(ATTACKER, {"metadata": {"labels": {
             "pod-security.kubernetes.io/enforce": "privileged"}}})),
        ("A's user submits a Job with WorkloadPriorityClass high (preempts B)", attacks.VAP,
         lambda: batch.create_namespaced_job(ATTACKER, priority_job("high"), dry_run="All")),
        ("A's user claims B's volume by name (spec.volumeName)", attacks.RBAC,
         lambda: core.create_namespaced_persistent_volume_claim(ATTACKER, claim_of(
             reallab), dry_run="All")),
    )]  # fmt: skip
    rows.append(claim_by_a_granted_account(reallab))
    pss = attacks.POD_SECURITY_LAYER  # and privileged: the API server's own flag, before it
    rows += [attempt(f"A's pod asks for {escape}",
                     attacks.NO_PRIVILEGED if "privileged" in escape else pss,
                     lambda c=change: core.create_namespaced_pod(  # type: ignore[misc]
                         ATTACKER, attacks.pod("escape", c), dry_run="All"))
             for escape, change in attacks.POD_ESCAPES.items()]  # fmt: skip
    allowed = attempt("control: A's user submits a Job with its own priority normal", "",
                      lambda: batch.create_namespaced_job(ATTACKER, priority_job("normal"),
                                                          dry_run="All"))  # fmt: skip
    assert allowed.refused_by == "", allowed  # the policy refuses what it must, not everything
    matrix += rows
    assert all(r.held for r in rows), [r for r in rows if not r.held]


def priority_job(priority: str) -> dict[str, Any]:
    """A suspended Job of A's queue with Kueue's priority-class label ``priority``."""
    template = attacks.pod("p")
    template["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"p-{priority}",
            "labels": {"kueue.x-k8s.io/queue-name": ATTACKER,
                       "kueue.x-k8s.io/priority-class": priority}},
            "spec": {"suspend": True, "template": {"spec": template["spec"]}}}  # fmt: skip


def claim_by_a_granted_account(cluster: DevCluster) -> Row:
    """Where A's admin lets an account of A make claims (RBAC allows it), the chart's policy
    still refuses one that names B's volume."""
    from kubernetes import client

    account = "claimer"
    grant = {"apiGroup": "rbac.authorization.k8s.io"}
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    cluster.core.create_namespaced_service_account(ATTACKER, {"metadata": {"name": account}})
    rbac.create_namespaced_role(
        ATTACKER,
        {
            "metadata": {"name": account},
            "rules": [
                {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ATTACKER,
        {
            "metadata": {"name": account},
            "roleRef": {**grant, "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ATTACKER}],
        },
    )
    try:
        api = attacks.impersonating(cluster, f"system:serviceaccount:{ATTACKER}:{account}",
                                    f"system:serviceaccounts:{ATTACKER}")  # fmt: skip
        return attempt("an account of A that may make claims names B's volume", attacks.VAP,
                       lambda: client.CoreV1Api(api).create_namespaced_persistent_volume_claim(
                           ATTACKER, claim_of(cluster), dry_run="All"))  # fmt: skip
    finally:
        rbac.delete_namespaced_role_binding(account, ATTACKER)
        rbac.delete_namespaced_role(account, ATTACKER)
        cluster.core.delete_namespaced_service_account(account, ATTACKER)


def claim_of(cluster: DevCluster) -> dict[str, Any]:
    """A claim in A that names the volume bound to B's checkpoint claim."""
    volume = cluster.core.read_namespaced_persistent_volume_claim(CLAIM, TENANT).spec.volume_name
    assert volume, f"{CLAIM} is bound"
    return {"metadata": {"name": "taken"}, "spec": {
        "accessModes": ["ReadWriteMany"], "volumeName": volume,
        "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip


def test_a_queue_of_as_pointing_to_bs_clusterqueue_admits_nothing(
    reallab: DevCluster, matrix: list[Row]
) -> None:
    """Made by an admin's mistake (A's user may not make one, above): Kueue still admits none
    of A's jobs to B's ClusterQueue, whose namespaceSelector names B's namespace alone."""
    from kubernetes import client

    kueue = ("kueue.x-k8s.io", "v1beta2")
    reallab.custom.create_namespaced_custom_object(*kueue, ATTACKER, "localqueues", {
        "apiVersion": "/".join(kueue), "kind": "LocalQueue", "metadata": {"name": "borrowed"},
        "spec": {"clusterQueue": TENANT}})  # fmt: skip
    batch = client.BatchV1Api(attacks.impersonating(reallab, "mallory", ATTACKER))
    job = priority_job("normal")
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "borrowed"
    try:
        batch.create_namespaced_job(ATTACKER, job)
        held = poll_until(lambda: inadmissible(reallab, job["metadata"]["name"]),
                          what="Kueue's verdict on the job", timeout=60)  # fmt: skip
        admitted = reallab.custom.get_namespaced_custom_object(*kueue, ATTACKER, "workloads",
                                                               held["name"])  # fmt: skip
        reserved = admitted.get("status", {}).get("admission")
        row = Row("A's job in a LocalQueue of A pointing to B's ClusterQueue", attacks.KUEUE,
                  attacks.KUEUE if reserved is None else "", held["message"])  # fmt: skip
    finally:
        path = f"/apis/batch/v1/namespaces/{ATTACKER}/jobs/{job['metadata']['name']}"
        attacks.raw(reallab.api, "DELETE", path, [("propagationPolicy", "Background")])
        reallab.custom.delete_namespaced_custom_object(*kueue, ATTACKER, "localqueues", "borrowed")
    matrix.append(row)
    assert row.held, row


def inadmissible(cluster: DevCluster, job: str) -> dict[str, str] | None:
    """The Workload of A's ``job`` once Kueue has said why it does not reserve quota."""
    for workload in cluster.workloads(ATTACKER):
        owners = [o["name"] for o in workload["metadata"].get("ownerReferences", [])]
        for c in workload.get("status", {}).get("conditions", []):
            if job in owners and c["type"] == "QuotaReserved" and c["status"] == "False":
                return {"name": workload["metadata"]["name"], "message": c["message"]}
    return None


def test_as_credentials_open_none_of_bs_checkpoints(tmp_path: Path, matrix: list[Row]) -> None:
    """The shared object store (versitygw with accounts of its own): B's checkpoints in B's
    bucket; A's account, which has a bucket of its own, may not read, list or overwrite them."""
    from botocore.exceptions import ClientError

    if not VERSITYGW.is_file():
        pytest.skip(f"versitygw not built at {VERSITYGW} (scripts/build-controlplane.sh)")
    with versitygw(tmp_path, iam=True) as server:
        mine, theirs = server.account(ATTACKER).client(), server.account(TENANT).client()
        theirs.create_bucket(Bucket=TENANT)
        key = f"{NAME}/step_1000/__0_0.distcp"
        theirs.put_object(Bucket=TENANT, Key=key, Body=b"weights")
        mine.create_bucket(Bucket=ATTACKER)
        rows = []
        for what, call in (
            ("reads B's checkpoint", lambda: mine.get_object(Bucket=TENANT, Key=key)),
            ("lists B's bucket", lambda: mine.list_objects_v2(Bucket=TENANT)),
            ("overwrites B's checkpoint",
             lambda: mine.put_object(Bucket=TENANT, Key=key, Body=b"poison")),
        ):  # fmt: skip
            try:
                call()
                rows.append(Row(f"A's S3 credentials {what}", attacks.OBJECT_STORE, "", "allowed"))
            except ClientError as exc:
                error = exc.response["Error"]
                by = attacks.OBJECT_STORE if error["Code"] == "AccessDenied" else ""
                rows.append(Row(f"A's S3 credentials {what}", attacks.OBJECT_STORE, by,
                                f"{error['Code']}: {error['Message']}"))  # fmt: skip
        assert theirs.get_object(Bucket=TENANT, Key=key)["Body"].read() == b"weights"
    matrix += rows
    assert all(r.held for r in rows), [r for r in rows if not r.held]


def test_every_attack_of_the_matrix_is_refused_where_expected(matrix: list[Row]) -> None:
    assert len(matrix) >= 25 and all(r.held for r in matrix), [r for r in matrix if not r.held]
