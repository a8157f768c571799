"""Who talks to the live cluster and how, for the dashboard's tests: a ServiceAccount's token, a
kubeconfig of it, a viewer bound to a role, and `kubectl port-forward` to a Service or pod."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from tests.support.devcluster import DevCluster


def account_token(cluster: DevCluster, namespace: str, name: str, *, create: bool = True) -> str:
    """An hour's token (TokenRequest) of ServiceAccount ``name`` in ``namespace``, made first
    unless not ``create``: how a person gets a token for a dashboard (`kubectl create token`)."""
    from kubernetes import client

    if create:
        cluster.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    found = cluster.core.create_namespaced_service_account_token(name, namespace, request)
    return str(found.status.token)


def token_env(cluster: DevCluster, name: str, token: str) -> dict[str, str]:
    """The env of a process that talks to the cluster with ``token`` (a kubeconfig of it)."""
    import json

    from gpufleet.devcluster.pki import Pki
    from gpufleet.devcluster.state import State

    state = State.read(cluster.dir)
    assert state is not None
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "c", "cluster": {
               "server": state.server, "certificate-authority": str(Pki(cluster.dir / "pki").ca)}}],
           "users": [{"name": name, "user": {"token": token}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": name}}]}  # fmt: skip
    path = cluster.root / f"{name}.kubeconfig"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return cluster.env | {"KUBECONFIG": str(path)}


@contextlib.contextmanager
def port_forward(cluster: DevCluster, namespace: str, target: str, port: int) -> Iterator[str]:
    """`kubectl port-forward -n NAMESPACE TARGET` (e.g. svc/NAME) of ``port`` to a free port of
    the host while in the block: yields ``127.0.0.1:PORT``."""
    import shutil

    from gpufleet.net import free_port
    from tests.support.paths import REPO

    # kubectl as the control-plane build finds it: on PATH, else the one `make tools` fetched
    kubectl = shutil.which("kubectl") or str(REPO / ".tools" / "bin" / "kubectl")
    local = free_port()
    forward = subprocess.Popen(
        [kubectl, "--kubeconfig", str(cluster.kubeconfig), "port-forward", "-n", namespace,
         target, f"{local}:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert forward.stdout is not None
        first = forward.stdout.readline()
        assert "Forwarding from 127.0.0.1" in first, first
        yield f"127.0.0.1:{local}"
    finally:
        forward.terminate()
        forward.communicate(timeout=30)


# A viewer of the dashboard: (its ServiceAccount's namespace, "Role" or "ClusterRole", the role).
Viewer = tuple[str, str, str]


def viewer_token(cluster: DevCluster, name: str, viewer: Viewer) -> str:
    """A ServiceAccount ``name`` bound to the viewer's role (a Role in its namespace, or a
    ClusterRole), and its token."""
    namespace, kind, role = viewer
    token = account_token(cluster, namespace, name)
    rbac = cluster.typed("RbacAuthorizationV1Api")
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}
    binding = {"metadata": {"name": f"viewer-{name}"}, "subjects": [subject], "roleRef": ref}
    if kind == "Role":
        rbac.create_namespaced_role_binding(namespace, binding)
    else:
        rbac.create_cluster_role_binding(binding)
    return token


def drop_viewer(cluster: DevCluster, name: str, viewer: Viewer) -> None:
    """Undo viewer_token (what of it was made)."""
    from kubernetes.client.exceptions import ApiException

    namespace, kind, _ = viewer
    rbac = cluster.typed("RbacAuthorizationV1Api")
    with contextlib.suppress(ApiException):
        if kind == "Role":
            rbac.delete_namespaced_role_binding(f"viewer-{name}", namespace)
        else:
            rbac.delete_cluster_role_binding(f"viewer-{name}")
    with contextlib.suppress(ApiException):
        cluster.core.delete_namespaced_service_account(name, namespace)
