"""Secrets sealed offline with kubeseal and the cluster's Sealed Secrets certificate (the one
`cluster up --with sealed-secrets` writes), applied, and unsealed by the real controller."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import yaml

from gpufleet.devcluster.addons import SEALED_SECRETS
from gpufleet.devcluster.build import KUBESEAL, binaries_dir
from tests.support.devcluster import DevCluster
from tests.support.procs import poll_until

GROUP, VERSION, PLURAL = "bitnami.com", "v1alpha1", "sealedsecrets"


def seal(cluster: DevCluster, namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    """The SealedSecret of a Secret ``name`` in ``namespace`` holding ``data``: kubeseal reads
    the Secret on stdin and seals it with the certificate alone, as on a laptop with no access
    to the cluster (strict scope: it opens only under that name, in that namespace)."""
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": name, "namespace": namespace}, "stringData": data}  # fmt: skip
    cert = cluster.dir / f"{SEALED_SECRETS.name}.pem"
    done = subprocess.run(
        [str(binaries_dir() / KUBESEAL), "--cert", str(cert), "-o", "yaml"],
        input=yaml.safe_dump(secret), capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin"},  # no KUBECONFIG: nothing but the certificate
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sealed: dict[str, Any] = yaml.safe_load(done.stdout)
    return sealed


def apply(cluster: DevCluster, sealed: dict[str, Any]) -> None:
    """Create the SealedSecret in its namespace."""
    namespace = sealed["metadata"]["namespace"]
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, sealed)


def synced(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The SealedSecret's Synced condition, once the controller has set it."""
    found = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    conditions = found.get("status", {}).get("conditions", [])
    return next((dict(c) for c in conditions if c["type"] == "Synced"), None)


def unsealed(cluster: DevCluster, namespace: str, name: str) -> dict[str, str]:
    """The Secret the controller made from SealedSecret ``name``: its data, decoded, once the
    SealedSecret is Synced and the Secret is owned by it."""
    poll_until(lambda: (synced(cluster, namespace, name) or {}).get("status") == "True",
               what=f"SealedSecret {namespace}/{name} Synced", timeout=60)  # fmt: skip
    secret = cluster.core.read_namespaced_secret(name, namespace)
    owners = [(o.kind, o.name) for o in secret.metadata.owner_references or []]
    assert owners == [("SealedSecret", name)], owners
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def refused(cluster: DevCluster, namespace: str, name: str) -> str:
    """The controller's message for a SealedSecret it could not open (Synced False)."""

    def failed() -> dict[str, Any] | None:
        found = synced(cluster, namespace, name)
        return found if found and found.get("status") == "False" else None

    poll_until(lambda: failed() is not None, what=f"{namespace}/{name} refused", timeout=60)
    return str((failed() or {}).get("message", ""))
