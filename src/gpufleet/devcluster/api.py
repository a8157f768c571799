"""The API calls ``cluster up`` makes on its own cluster, through the official kubernetes client
and the admin kubeconfig: create what manifests hold, and the readiness checks it waits on."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.cluster.apierrors import api_errors
from gpufleet.errors import ClusterUpError
from gpufleet.kube import Obj


def wait(check: Callable[[], bool], what: str, timeout: float, log: Callable[[str], None]) -> None:
    """Poll ``check`` until it is true (ClusterUpError after ``timeout`` s); log how long."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise ClusterUpError(f"{what}: not ready after {timeout:g} s")
        time.sleep(0.2)
    log(f"  {what} ready ({time.monotonic() - started:.1f} s)")


class Api:
    """The cluster's API as its admin (a client per call: the kubeconfig may be written after
    this object is made, and several threads call at once)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def client(self) -> Any:
        """A kubernetes ApiClient on the admin kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def core(self) -> Any:
        """CoreV1Api."""
        from kubernetes import client

        return client.CoreV1Api(self.client())

    def create_all(self, objects: list[Obj]) -> None:
        """Create objects of built-in kinds (and CRDs), in order."""
        from kubernetes import utils

        api = self.client()
        for obj in objects:
            utils.create_from_dict(api, obj)

    def create_custom(self, objects: list[Obj], dry_run: str | None = None) -> None:
        """Create objects of custom kinds (the Trainer's runtimes, webhook probes)."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.client())
        for obj in objects:
            group, version = obj["apiVersion"].split("/")
            plural = obj["kind"].lower() + "s"
            ns = obj["metadata"].get("namespace")
            if ns:
                custom.create_namespaced_custom_object(
                    group, version, ns, plural, obj, dry_run=dry_run
                )
            else:
                custom.create_cluster_custom_object(group, version, plural, obj, dry_run=dry_run)

    def served_crds(self) -> set[str]:
        """The names of the CRDs the API server has."""
        from kubernetes import client

        listed = client.ApiextensionsV1Api(self.client()).list_custom_resource_definition()
        return {str(c.metadata.name) for c in listed.items if c.metadata}

    def crds_established(self, names: list[str]) -> bool:
        """Whether every CRD in ``names`` is Established."""
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self.client())
        for name in names:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    def dry_run(self, obj: Obj) -> bool:
        """Create ``obj`` with dryRun=All; False while a webhook cannot be called."""
        try:
            self.create_custom([obj], dry_run="All")
        except api_errors():
            return False
        return True

    def lease_held(self, namespace: str, name: str) -> bool:
        """Whether somebody holds the Lease (a controller that works only while leading)."""
        from kubernetes import client

        try:
            lease = client.CoordinationV1Api(self.client()).read_namespaced_lease(name, namespace)
        except api_errors():
            return False
        return bool(lease.spec and lease.spec.holder_identity)

    def tls_secret(self, namespace: str, name: str) -> tuple[bytes, bytes] | None:
        """(tls.crt, tls.key) of a Secret once both are filled; None until then."""
        try:
            data = self.core().read_namespaced_secret(name, namespace).data or {}
        except api_errors():
            return None
        if not data.get("tls.crt") or not data.get("tls.key"):
            return None
        return base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])

    def service_account_token(self, namespace: str, name: str, seconds: int) -> str:
        """A token the API server issues for ServiceAccount ``name`` (TokenRequest), as the
        kubelet gets a pod's."""
        request = {"spec": {"audiences": [], "expirationSeconds": seconds}}
        made = self.core().create_namespaced_service_account_token(name, namespace, request)
        return str(made.status.token)

    def nodes_ready(self, count: int | list[str]) -> bool:
        """Whether at least ``count`` nodes report Ready, or every node named."""
        try:
            listed = self.core().list_node().items
        except api_errors():  # the API may still be settling; readiness is polled again
            return False
        ready = [
            n for n in listed
            if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        ]  # fmt: skip
        if isinstance(count, list):
            return set(count) <= {n.metadata.name for n in ready}
        return len(ready) >= count
