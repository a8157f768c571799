"""Claims on the real nodes' shared storage class for the real-node tests: made, and one of the
same name that an earlier module deleted waited out first."""

from __future__ import annotations

from gpufleet.devcluster.realnodes.storage import STORAGE_CLASS
from tests.support import devcluster
from tests.support.procs import poll_until
from tests.support.realnodes import TENANT


def shared_claim(
    cluster: devcluster.DevCluster, name: str, volume: str | None = None, namespace: str = ""
) -> None:
    """A ReadWriteMany claim in the tenant (or ``namespace``) on the real nodes' shared storage
    class; bound to ``volume`` at once when given (the class binds others when a pod first uses
    them). One of that name that an earlier module deleted is waited for: its protection
    finalizer holds it until that module's pods are gone, and a create meanwhile is refused
    ("object is being deleted")."""
    spec = {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}}}  # fmt: skip
    poll_until(lambda: not being_deleted(cluster, name, namespace or TENANT),
               what=f"the claim {name} deleted before", timeout=120)  # fmt: skip
    cluster.core.create_namespaced_persistent_volume_claim(namespace or TENANT, {
        "metadata": {"name": name}, "spec": {**spec, **({"volumeName": volume} if volume else {})},
    })  # fmt: skip


def being_deleted(cluster: devcluster.DevCluster, name: str, namespace: str) -> bool:
    """Whether the claim is there with a deletionTimestamp (its finalizer not yet done)."""
    from kubernetes.client.exceptions import ApiException

    try:
        claim = cluster.core.read_namespaced_persistent_volume_claim(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return claim.metadata.deletion_timestamp is not None
