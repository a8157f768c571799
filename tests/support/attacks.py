"""The tenant attack matrix (issue 55, item 6): tenant A's user, through the API server with
the chart's own RoleBinding (the admin impersonating a member of A's group), tries what it must
not; each attempt is a row naming the layer expected to refuse it, the layer that did (read
from the refusal itself) and its message. tests/cluster/test_realnodes_attacks.py runs them
with the network and object store attacks, and writes the table."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.kube import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL
from gpufleet.render.podspec import CONTAINER_SECURITY, POD_SECURITY
from tests.support.devcluster import DevCluster
from tests.support.devlab import KUEUE
from tests.support.realnodes import CLAIM, TENANT

RBAC, POD_SECURITY_LAYER, VAP = "RBAC", "Pod Security", "ValidatingAdmissionPolicy"
KUEUE_LAYER, NETPOL, KUBELET = "Kueue", "network policy", "kubelet"
OBJECT_STORE = "object store"
# The API server's own validation: it runs with --allow-privileged=false (devcluster/components)
NO_PRIVILEGED = "API server (--allow-privileged=false)"
DRY_RUN = "All"  # a create that is not refused (a hole) leaves nothing behind
ATTACKER, USER = "product", "mallory"  # tenant A (the lab's other tenant), a member of its group
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Row:
    """One attack: what was tried, the layer expected to refuse it, the one that did ("" for
    none: it got through) and what it said."""

    attack: str
    expected: str
    refused_by: str
    message: str

    @property
    def held(self) -> bool:
        return self.refused_by == self.expected


def refusal(status: int, body: str) -> str:
    """The layer a refusal of the API server names (its status and message)."""
    if "ValidatingAdmissionPolicy" in body:
        return VAP
    if "violates PodSecurity" in body:
        return POD_SECURITY_LAYER
    if status == 422 and "privileged: Forbidden: disallowed by cluster policy" in body:
        return NO_PRIVILEGED
    if status == 403 and ("cannot " in body or "attempting to grant RBAC" in body):
        return RBAC
    return f"HTTP {status}"


def attempt(attack: str, expected: str, call: Callable[[], Any]) -> Row:
    """Run one API attack: the row says who refused it, or that nothing did."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        body = str(exc.body or exc.reason)
        return Row(attack, expected, refusal(exc.status, body), message_of(body))
    return Row(attack, expected, "", "allowed")


def message_of(body: str) -> str:
    """The API server's message from a Status body (its text, else the body), one line."""
    found = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', body)
    text = found.group(1).encode().decode("unicode_escape") if found else body
    return " ".join(text.split())[:240]


def impersonating(cluster: DevCluster, user: str, group: str) -> Any:
    """An ApiClient of the admin that acts as ``user`` in ``group`` (Impersonate-* headers):
    every request is authorized as that user, by the chart's RoleBinding of the group."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    api.set_default_header("Impersonate-Group", group)
    return api


def raw(api: Any, method: str, path: str, query: list[tuple[str, str]] | None = None) -> Any:
    """A request the typed clients do not make (an exec's POST, a Job's deletion with its
    pods); an answer of 400 or more raised as the typed clients raise it."""
    from kubernetes.client.exceptions import ApiException

    method, url, headers, body, _ = api.param_serialize(
        method, path, query_params=query or [], auth_settings=["BearerToken"]
    )
    resp = api.call_api(method, url, header_params=headers, body=body)
    resp.read()
    if resp.status >= 400:
        raise ApiException(http_resp=resp)
    return resp


def pod(name: str, change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A pod that passes Pod Security restricted as the renderers make it, then ``change``d."""
    container = {"name": "c", "image": "localhost/gpufleet:cpu", "command": ["true"],
                 "securityContext": dict(CONTAINER_SECURITY)}  # fmt: skip
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [container], "securityContext": dict(POD_SECURITY)}}  # fmt: skip
    if change is not None:
        change(doc)
    return doc


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = doc["spec"]["containers"][0]
    return container


# Pod Security restricted's controls, each broken by one change of a restricted pod.
POD_ESCAPES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a privileged container": lambda d: _container(d)["securityContext"].update(privileged=True),
    "a hostPath volume (the node's /)": lambda d: d["spec"].update(
        volumes=[{"name": "host", "hostPath": {"path": "/"}}]
    ),
    "hostNetwork": lambda d: d["spec"].update(hostNetwork=True),
    "hostPID": lambda d: d["spec"].update(hostPID=True),
    "hostIPC": lambda d: d["spec"].update(hostIPC=True),
    "capability NET_RAW": lambda d: _container(d)["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["NET_RAW"]}
    ),
    "capability SYS_ADMIN": lambda d: _container(d)["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    ),
    "running as root (runAsUser 0)": lambda d: d["spec"]["securityContext"].update(
        runAsNonRoot=False, runAsUser=0
    ),
}


def write_table(rows: list[Row], path: Path, context: list[str]) -> None:
    """The matrix as a Markdown table (attack, expected layer, refused by, message), after
    ``context`` (how it was made: versions, machine)."""
    lines = ["# Tenant attack matrix", "", *context, "",
             f"{sum(r.held for r in rows)} of {len(rows)} attacks refused by the layer expected.",
             "", "| # | attack | expected layer | refused by | message |",
             "|---:|---|---|---|---|"]  # fmt: skip
    for i, row in enumerate(rows, 1):
        message = row.message.replace("|", "\\|")
        lines.append(f"| {i} | {row.attack} | {row.expected} | {row.refused_by or 'NOT REFUSED'}"
                     f" | {message} |")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def user_attacks(cluster: DevCluster, api: Any, pod_0: str) -> list[tuple[str, str, Any]]:
    """What A's user (``api``) tries through the API: B's objects, B's pod 0 and the platform's
    guards (RBAC), a priority and a volume that are not A's (the chart's policy). Each create
    is a dry run: one that got through would leave nothing."""
    from kubernetes import client

    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    custom, rbac = client.CustomObjectsApi(api), client.RbacAuthorizationV1Api(api)
    queue = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
             "metadata": {"name": "borrowed"}, "spec": {"clusterQueue": TENANT}}  # fmt: skip
    admin = {
        "metadata": {"name": "mine"},
        "subjects": [{"kind": "User", "name": USER, "apiGroup": RBAC_GROUP}],
        "roleRef": {"kind": "ClusterRole", "name": "cluster-admin", "apiGroup": RBAC_GROUP},
    }
    privileged = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    execute = f"/api/v1/namespaces/{TENANT}/pods/{pod_0}/exec"
    return [
        ("A's user lists B's pods", RBAC, lambda: core.list_namespaced_pod(TENANT)),
        (
            "A's user reads B's pod 0's log",
            RBAC,
            lambda: core.read_namespaced_pod_log(pod_0, TENANT),
        ),
        (
            "A's user execs into B's pod 0",
            RBAC,
            lambda: raw(api, "POST", execute, [("command", "id"), ("stdout", "true")]),
        ),
        (
            "A's user creates a pod in B",
            RBAC,
            lambda: core.create_namespaced_pod(TENANT, pod("intruder"), dry_run=DRY_RUN),
        ),
        ("A's user lists B's Secrets", RBAC, lambda: core.list_namespaced_secret(TENANT)),
        ("A's user lists B's ConfigMaps", RBAC, lambda: core.list_namespaced_config_map(TENANT)),
        (
            "A's user lists B's claims",
            RBAC,
            lambda: core.list_namespaced_persistent_volume_claim(TENANT),
        ),
        ("A's user lists B's Jobs", RBAC, lambda: batch.list_namespaced_job(TENANT)),
        (
            "A's user lists B's Kueue Workloads",
            RBAC,
            lambda: custom.list_namespaced_custom_object(*KUEUE, TENANT, "workloads"),
        ),
        (
            "A's user reads Sealed Secrets' private keys (kube-system)",
            RBAC,
            lambda: core.list_namespaced_secret("kube-system"),
        ),
        (
            "A's user makes a LocalQueue in A pointing to B's ClusterQueue",
            RBAC,
            lambda: custom.create_namespaced_custom_object(
                *KUEUE, ATTACKER, "localqueues", queue, dry_run=DRY_RUN
            ),
        ),
        (
            "A's user raises A's ClusterQueue's quota",
            RBAC,
            lambda: custom.patch_cluster_custom_object(
                *KUEUE, "clusterqueues", ATTACKER, {"spec": {"cohort": "mine"}}
            ),
        ),
        (
            "A's user binds itself cluster-admin in A",
            RBAC,
            lambda: rbac.create_namespaced_role_binding(ATTACKER, admin, dry_run=DRY_RUN),
        ),
        (
            "A's user relabels A's namespace Pod Security privileged",
            RBAC,
            lambda: core.patch_namespace(ATTACKER, privileged),
        ),
        (
            "A's user submits a Job with WorkloadPriorityClass high (preempts B)",
            VAP,
            lambda: batch.create_namespaced_job(ATTACKER, priority_job("high"), dry_run=DRY_RUN),
        ),
        (
            "A's user claims B's volume by name (spec.volumeName)",
            RBAC,
            lambda: core.create_namespaced_persistent_volume_claim(
                ATTACKER, claim_of(cluster), dry_run=DRY_RUN
            ),
        ),
    ]


def priority_job(priority: str, pod_priority: str = "") -> dict[str, Any]:
    """A suspended Job of A's queue with Kueue's priority-class label ``priority`` (none if
    ""), its pods' PriorityClass ``pod_priority`` (none if "")."""
    template = pod("p")
    template["spec"]["restartPolicy"] = "Never"
    if pod_priority:
        template["spec"]["priorityClassName"] = pod_priority
    labels = {KUEUE_QUEUE_LABEL: ATTACKER} | ({KUEUE_PRIORITY_LABEL: priority} if priority else {})
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"p-{priority or pod_priority}", "labels": labels},
            "spec": {"suspend": True, "template": {"spec": template["spec"]}}}  # fmt: skip


def claim_by_a_granted_account(cluster: DevCluster) -> Row:
    """Where A's admin lets an account of A make claims (RBAC allows it), the chart's policy
    still refuses one that names B's volume."""
    from kubernetes import client

    account = "claimer"
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rules = [{"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create"]}]
    binding = {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ATTACKER}],
    }
    cluster.core.create_namespaced_service_account(ATTACKER, {"metadata": {"name": account}})
    rbac.create_namespaced_role(ATTACKER, {"metadata": {"name": account}, "rules": rules})
    rbac.create_namespaced_role_binding(ATTACKER, binding)
    try:
        api = impersonating(cluster, f"system:serviceaccount:{ATTACKER}:{account}",
                            f"system:serviceaccounts:{ATTACKER}")  # fmt: skip
        return attempt("an account of A that may make claims names B's volume", VAP,
                       lambda: client.CoreV1Api(api).create_namespaced_persistent_volume_claim(
                           ATTACKER, claim_of(cluster), dry_run=DRY_RUN))  # fmt: skip
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
