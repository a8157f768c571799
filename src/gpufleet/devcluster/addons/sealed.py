"""Sealed Secrets (bitnami/sealed-secrets 0.40, controlplane/sealed-secrets): SealedSecrets
sealed offline with the controller's public certificate (``kubeseal --cert``), kept in git, and
unsealed into Secrets by the controller, which alone holds the private key. Installed from its
module's own Helm chart (CRD, RBAC, Services; scripts/build-controlplane.sh renders it) when
`cluster up --with sealed-secrets` asks: a cluster without it runs as before.

The controller reads only the in-cluster configuration (client-go's ``rest.InClusterConfig``:
the ServiceAccount token, CA and namespace at SERVICE_ACCOUNT_DIR, the API server from
$KUBERNETES_SERVICE_HOST and _PORT); it has no kubeconfig flag. So beside the API server it runs
as a pod's process would: in a mount namespace of its own (``unshare``, root only), where a
tmpfs over /run holds its ServiceAccount's files, a token the API server issued for that
ServiceAccount (TokenRequest) and the cluster's CA. Nothing is written on the host's /run; the
mounts end with the process. The chart's RBAC, bound to that ServiceAccount, authorizes it."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.devcluster.addons.base import Addon, Config

# client-go's constant (rest.InClusterConfig, and the controller's own namespace lookup).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# How long the controller's token lasts: the local cluster's life, most likely (a cluster up for
# longer: `cluster down` and `up` again; client-go reads the file again, not the API).
TOKEN_SECONDS = 30 * 24 * 3600
CERT_PATH = "/v1/cert.pem"  # the controller's public certificate, on its HTTP port

SEALED_SECRETS = Addon(
    name="sealed-secrets-controller",  # also kubeseal's default --controller-name
    project="sealed-secrets",
    namespace="kube-system",  # kubeseal's default --controller-namespace
    service_account="sealed-secrets-controller",
    config=Config.FLAGS,
    # Its Deployment's arguments (the chart's), on loopback: the HTTP port (certificate,
    # /healthz) is what the local cluster calls its health port.
    flags=(
        "--update-status",
        "--key-prefix=sealed-secrets-key",
        "--listen-addr=127.0.0.1:{health}",
        "--listen-metrics-addr=127.0.0.1:{metrics}",
    ),
    ready_path="/healthz",
    public_cert=CERT_PATH,
    optional=True,
    in_cluster=True,
)

# Run in the new mount namespace, then the controller in its place (the same pid, which
# `cluster down` stops): /run as a tmpfs with the ServiceAccount's files bound in, read-only.
_MOUNT = (
    'run=$(readlink -f /var/run) && mount -t tmpfs -o mode=0755,size=1m gpufleet-sa "$run" && '
    'mkdir -p "$run/secrets/kubernetes.io/serviceaccount" && '
    'mount --bind -o ro "$1" "$run/secrets/kubernetes.io/serviceaccount" && shift && exec "$@"'
)


def service_account_dir(addon: Addon, workdir: Path) -> Path:
    """Where the manager's ServiceAccount files are kept, in the cluster's directory."""
    return workdir / f"{addon.name}-serviceaccount"


def write_service_account(directory: Path, token: str, ca: bytes, namespace: str) -> None:
    """The files a pod's ServiceAccount volume holds (token, ca.crt, namespace); the token
    readable by root alone."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    token_file = directory / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    (directory / "ca.crt").write_bytes(ca)
    (directory / "namespace").write_text(namespace)


def in_cluster_argv(argv: list[str], account: Path) -> list[str]:
    """``argv`` run in a mount namespace of its own with ``account`` as its ServiceAccount's
    directory (``unshare``; the namespace's mounts are private: nothing reaches the host)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, "sh",
            str(account), *argv]  # fmt: skip


def in_cluster_env(server: str, namespace: str) -> dict[str, str]:
    """The environment the kubelet gives a pod: where the API server is, and its namespace."""
    parts = urlsplit(server)
    return {
        "KUBERNETES_SERVICE_HOST": parts.hostname or "",
        "KUBERNETES_SERVICE_PORT": str(parts.port or 443),
        "POD_NAMESPACE": namespace,
    }


def may_unshare() -> bool:
    """Whether this process may make a mount namespace (root)."""
    return os.geteuid() == 0
