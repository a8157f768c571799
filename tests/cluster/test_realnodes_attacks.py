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
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gpufleet.devcluster.realnodes.configs import KUBELET_PORT
from gpufleet.devcluster.realnodes.network import HOST_IP
from gpufleet.devcluster.state import State
from gpufleet.kube import KUEUE_QUEUE_LABEL
from gpufleet.render.podspec import RDZV_PORT
from gpufleet.runtime.metrics import STEP
from tests.support import attacks
from tests.support.attacks import Row, attempt, priority_job
from tests.support.devcluster import CLUSTER_POLL_S, DevCluster
from tests.support.devlab import KUEUE
from tests.support.paths import REPO
from tests.support.probes import (
    OPEN,
    REFUSED,
    enforced_for,
    namespace,
    probe,
    probe_once_enforced,
)
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT, pod_log, real_job, running_pod, submit
from tests.support.s3 import VERSITYGW, versitygw

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(600)]  # fmt: skip
ATTACKER, USER = attacks.ATTACKER, attacks.USER
MONITORING = "monitoring"  # the chart's networkPolicy.monitoringNamespace
OUTSIDE = "netpol-outside"  # no network policy at all
METRICS_PORT = 9411
MATRIX = REPO / "benchmarks" / "results" / "tenant-attack-matrix.md"
NAME = "victim"


@pytest.fixture(scope="module")
def matrix() -> list[Row]:
    """The rows the tests below add (the last one writes them)."""
    return []


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
    """From A's pod: B's rendezvous and metrics ports (open to B's own pods, above), each
    node's kubelet, etcd on the API server's host, and the API server itself without a token;
    from a namespace with no policy: B's ports again, and a kubelet, which answers there (so
    it was A's egress policy that refused A's pod) and refuses on its own."""
    address = victim["status"]["podIP"]
    state = State.read(reallab.dir)
    assert state is not None
    targets = Targets(address, state.ports["etcd"], state.ports["kube-apiserver"], {
        n.metadata.name: next(a.address for a in n.status.addresses if a.type == "InternalIP")
        for n in reallab.core.list_node().items})  # fmt: skip
    seen = probe_once_enforced(reallab, ATTACKER, "intruder", targets.want())
    rows = network_rows(targets, seen, "A's pod")
    namespace(reallab, OUTSIDE)
    name = sorted(targets.nodes)[0]
    outside = {"connect": targets.want()["connect"][:2], "fetch": [targets.kubelet(name)]}
    seen = probe(reallab, OUTSIDE, "outsider", outside)
    where = "a pod of a namespace without policies"
    rows += network_rows(Targets(address, 0, 0, {}), seen, where)
    answer = seen[targets.kubelet(name)]
    rows.append(
        Row(
            f"{where} calls node {name}'s kubelet API",
            attacks.KUBELET,
            attacks.KUBELET if answer[:3] == "401" else "",
            f"GET /pods: {answer}",
        )
    )
    matrix += rows
    assert all(r.held for r in rows), [r for r in rows if not r.held]


@dataclass(frozen=True)
class Targets:
    """What A's pod tries to reach: B's pod 0, etcd's and the API server's ports on the host,
    the nodes' kubelets (0 and {}: not tried)."""

    address: str
    etcd: int
    api: int
    nodes: dict[str, str]

    def kubelet(self, node: str) -> str:
        return f"https://{self.nodes[node]}:{KUBELET_PORT}/pods"

    @property
    def secrets(self) -> str:
        return f"https://{HOST_IP}:{self.api}/api/v1/namespaces/{TENANT}/secrets"

    def want(self) -> dict[str, Any]:
        """The probe's request."""
        return {"connect": [[self.address, RDZV_PORT], [self.address, METRICS_PORT],
                            [HOST_IP, self.etcd], *([ip, KUBELET_PORT] for ip in
                                                    self.nodes.values())],
                "fetch": [self.secrets, *map(self.kubelet, self.nodes)]}  # fmt: skip


def network_rows(targets: Targets, seen: dict[str, Any], who: str) -> list[Row]:
    """The rows of what a probe met, for the targets it tried."""
    netpol = lambda met: attacks.NETPOL if met != OPEN else ""  # noqa: E731
    rows = [Row(f"{who} connects to B's pod 0 {what} port {port}", attacks.NETPOL,
                netpol(seen[f"{targets.address}:{port}"]),
                f"connection: {seen[f'{targets.address}:{port}']}")
            for port, what in ((RDZV_PORT, "rendezvous"), (METRICS_PORT, "metrics"))]  # fmt: skip
    for name, ip in targets.nodes.items():
        met, answer = seen[f"{ip}:{KUBELET_PORT}"], seen[targets.kubelet(name)]
        rows.append(
            Row(
                f"{who} calls node {name}'s kubelet API ({ip}:{KUBELET_PORT})",
                attacks.NETPOL,
                netpol(met),
                f"connection: {met}; GET /pods: {answer}",
            )
        )
    if targets.etcd:
        met, loopback = seen[f"{HOST_IP}:{targets.etcd}"], "etcd on 127.0.0.1 only"
        rows.append(
            Row(
                f"{who} connects to etcd (its port, on the API server's host {HOST_IP})",
                loopback,
                loopback if met == REFUSED else "",
                f"connection: {met}",
            )
        )
    if targets.api:  # anonymous: the API server takes it as system:anonymous, granted nothing
        answer = seen[targets.secrets]
        anonymous = answer[:3] == "403" and "system:anonymous" in answer
        rows.append(
            Row(
                f"{who} lists B's Secrets on the API server with no token",
                attacks.RBAC,
                attacks.RBAC if anonymous else "",
                attacks.message_of(answer),
            )
        )
    return rows


def test_as_user_reads_and_changes_nothing_of_bs_nor_the_platforms(
    reallab: DevCluster, victim: dict[str, Any], matrix: list[Row]
) -> None:
    """A's user, with the chart's RoleBinding of A's group (tests/support/attacks.py,
    user_attacks); an account A's admin allowed claims; A's pods' escapes from restricted
    (privileged is refused first by the API server's own flag); and a control: A's job at its
    own priority passes the policy."""
    from kubernetes import client

    api = attacks.impersonating(reallab, USER, ATTACKER)
    rows = [attempt(*a) for a in attacks.user_attacks(reallab, api, victim["metadata"]["name"])]
    rows.append(attacks.claim_by_a_granted_account(reallab))
    core, pss = client.CoreV1Api(api), attacks.POD_SECURITY_LAYER
    rows += [attempt(f"A's pod asks for {escape}",
                     attacks.NO_PRIVILEGED if "privileged" in escape else pss,
                     lambda c=change: core.create_namespaced_pod(  # type: ignore[misc]
                         ATTACKER, attacks.pod("escape", c), dry_run=attacks.DRY_RUN))
             for escape, change in attacks.POD_ESCAPES.items()]  # fmt: skip
    allowed = attempt("control: A's job at its own priority", "",
                      lambda: client.BatchV1Api(api).create_namespaced_job(
                          ATTACKER, priority_job("normal"), dry_run=attacks.DRY_RUN))  # fmt: skip
    assert allowed.refused_by == "", allowed  # the policy refuses what it must, not everything
    matrix += rows
    assert all(r.held for r in rows), [r for r in rows if not r.held]


def test_a_queue_of_as_pointing_to_bs_clusterqueue_admits_nothing(
    reallab: DevCluster, matrix: list[Row]
) -> None:
    """Made by an admin's mistake (A's user may not make one, above): Kueue still admits none
    of A's jobs to B's ClusterQueue, whose namespaceSelector names B's namespace alone."""
    reallab.custom.create_namespaced_custom_object(*KUEUE, ATTACKER, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "borrowed"},
        "spec": {"clusterQueue": TENANT}})  # fmt: skip
    job = priority_job("normal")
    job["metadata"]["labels"][KUEUE_QUEUE_LABEL] = "borrowed"
    try:
        with users_job(reallab, job):
            held = poll_until(lambda: inadmissible(reallab, job["metadata"]["name"]),
                              what="Kueue's verdict on the job", timeout=60)  # fmt: skip
            admitted = reallab.custom.get_namespaced_custom_object(
                *KUEUE, ATTACKER, "workloads", held["name"]
            )
            kueue = attacks.KUEUE_LAYER
            row = Row("A's job in a LocalQueue of A pointing to B's ClusterQueue", kueue,
                      "" if admitted.get("status", {}).get("admission") else kueue,
                      held["message"])  # fmt: skip
    finally:
        reallab.custom.delete_namespaced_custom_object(*KUEUE, ATTACKER, "localqueues", "borrowed")
    matrix.append(row)
    assert row.held, row


def test_a_job_whose_pods_name_a_higher_priority_gets_no_workload(
    reallab: DevCluster, matrix: list[Row]
) -> None:
    """No priority label, but its pods' PriorityClass system-cluster-critical, which Kueue would
    take as the Workload's priority (any job kind): the policy refuses that Workload to Kueue
    (its log says so), so the job is never admitted and preempts nothing."""
    job = priority_job("", pod_priority="system-cluster-critical")
    name = job["metadata"]["name"]
    log = reallab.dir / "logs" / "kueue.log"
    with users_job(reallab, job):
        line = poll_until(lambda: next((x for x in log.read_text().splitlines()
                                        if f"job-{name}-" in x and "tenant-policy" in x), None),
                          what="Kueue's Workload refused", timeout=60)  # fmt: skip
        made = [
            w
            for w in reallab.workloads(ATTACKER)
            if name in [o["name"] for o in w["metadata"].get("ownerReferences", [])]
        ]
    refused = re.search(r"ValidatingAdmissionPolicy[^\\\"]*denied request: [^\\\"]*", line)
    row = Row("A's job whose pods name PriorityClass system-cluster-critical (preempts B)",
              attacks.VAP, attacks.VAP if refused and not made else "",
              refused.group(0) if refused else line[-240:])  # fmt: skip
    matrix.append(row)
    assert row.held, row


@contextmanager
def users_job(cluster: DevCluster, job: dict[str, Any]) -> Iterator[None]:
    """``job`` made by A's user in A, deleted with its pods after."""
    from kubernetes import client

    api = attacks.impersonating(cluster, USER, ATTACKER)
    client.BatchV1Api(api).create_namespaced_job(ATTACKER, job)
    try:
        yield
    finally:
        path = f"/apis/batch/v1/namespaces/{ATTACKER}/jobs/{job['metadata']['name']}"
        attacks.raw(cluster.api, "DELETE", path, [("propagationPolicy", "Background")])


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


def test_every_attack_of_the_matrix_is_refused_where_expected(
    reallab: DevCluster, matrix: list[Row]
) -> None:
    """The matrix, written when every test above has added its rows (a run of some of them
    leaves the file as it was), and every row held."""
    from kubernetes import client

    assert len(matrix) >= 25, f"{len(matrix)} rows: a test above failed or was not run"
    version = client.VersionApi(reallab.api).get_code().git_version
    # the victim's pod names are the run's own: the table stays the same from run to run
    pod_name = re.compile(rf"{NAME}-(\d)-[a-z0-9]{{5}}")
    stable = [replace(r, message=pod_name.sub(rf"{NAME}-\1-…", r.message)) for r in matrix]
    attacks.write_table(stable, MATRIX, [
        "Made by tests/cluster/test_realnodes_attacks.py on `gpufleet cluster up --real-nodes 2`",
        f"(Kubernetes {version} built here, kube-router's network policies, the chart with its",
        f"lab values): tenant A is `{ATTACKER}`, tenant B `{TENANT}`.",
    ])  # fmt: skip
    assert all(r.held for r in matrix), [r for r in matrix if not r.held]
