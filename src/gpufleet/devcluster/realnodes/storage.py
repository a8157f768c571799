"""Shared volumes for real nodes: statically provisioned PersistentVolumes (as the local static
provisioner makes them), each a directory of this host that every real node mounts. The nodes
share one host, so a volume is shared storage, as CephFS or NFS would be on a real cluster
(ReadWriteMany: a multi-node job's ranks write one checkpoint). Their StorageClass has no
provisioner; a claim binds when its pod is scheduled. ``down`` removes the directories."""

from __future__ import annotations

from pathlib import Path

from gpufleet.kube import Obj

STORAGE_CLASS = "gpufleet-shared"
VOLUMES = 6  # one per claim: a released volume is not bound again (reclaim policy Retain)
CAPACITY = "20Gi"


def make_dirs(directory: Path) -> None:
    """The volumes' directories, root's and closed to others: the kubelet gives each pod's
    fsGroup access when it mounts one (a volume owned by another user, as on a cluster)."""
    for index in range(VOLUMES):
        path = directory / f"pv-{index}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)


def shared_volumes(directory: Path, nodes: list[str]) -> list[Obj]:
    """The StorageClass and VOLUMES PersistentVolumes, each on every real node in ``nodes``."""
    storage_class: Obj = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }
    affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}  # fmt: skip
    volumes: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{STORAGE_CLASS}-{index}"},
            "spec": {
                "capacity": {"storage": CAPACITY},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "local": {"path": str(directory / f"pv-{index}")},
                "nodeAffinity": affinity,
            },
        }
        for index in range(VOLUMES)
    ]
    return [storage_class, *volumes]
