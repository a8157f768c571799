"""Serving on the real nodes: the digits model exported into a claim, an InferenceService that
`gpufleet serve` runs from the project's image, its pods that are ready."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpufleet.devcluster.realnodes.storage import STORAGE_CLASS
from tests.support.claims import shared_claim
from tests.support.devcluster import DevCluster
from tests.support.realnodes import TENANT, project_image

MODEL = "digits"


def exported(cluster: DevCluster, tmp: Path, claim: str) -> tuple[Any, Path]:
    """A digits model (TorchScript, seed 0) exported into a free shared volume that ``claim``
    binds; the model and where its repository lies on the host."""
    import torch

    from gpufleet.serve.export import export
    from gpufleet.workloads.digits import DigitsCNN

    wanted = (STORAGE_CLASS, "Available")
    free = [v for v in cluster.core.list_persistent_volume().items
            if (v.spec.storage_class_name, v.status.phase) == wanted]  # fmt: skip
    shared_claim(cluster, claim, volume=free[0].metadata.name)  # bound now, filled before use
    path = Path(free[0].spec.local.path)
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    torch.jit.save(torch.jit.script(model), str(tmp / "digits.pt"))
    export(str(tmp / "digits.pt"), path / "repo", name=MODEL, input_dims=(1, 8, 8))
    # As a writer pod of the tenant (UID 1000) would leave it: the kubelet hands a volume to
    # the pod's fsGroup only when it mounts it writable, and the server mounts it read-only.
    for each in [path, *path.rglob("*")]:
        os.chown(each, 1000, 1000)
    return model, path


def served_by_gpufleet(name: str, claim: str, **spec: Any) -> dict[str, Any]:
    """An InferenceService ``name`` in the tenant: `gpufleet serve` from the project's image,
    the claim's repository, one "GPU" (the real nodes are the lab's GPU nodes, tainted for GPU
    pods; it runs on the CPU); ``spec`` keys added."""
    source = {"name": MODEL, "pvc": {"claimName": claim, "subPath": "repo"}}
    base = {"server": "gpufleet", "image": project_image()[0], "model": source,
            "resources": {"gpu": 1}}  # fmt: skip
    return {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": TENANT}, "spec": {**base, **spec}}  # fmt: skip


def ready_pods(cluster: DevCluster, name: str) -> list[dict[str, Any]]:
    """The service's pods whose every container is ready."""

    def ready(pod: dict[str, Any]) -> bool:
        statuses = pod["status"].get("containerStatuses") or []
        return bool(statuses) and all(s.get("ready") for s in statuses)

    return [pod for pod in cluster.pods(TENANT, name) if ready(pod)]
