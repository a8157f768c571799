"""The nodes of a local cluster: pools (``NodeSpec``) and the kinds of node that can carry them.

A kind of node is one module implementing ``NodeKind``: what it changes on the host before the
control plane starts, what it creates through the API, and its processes, started once the
control plane is ready and stopped with it. kwok's fake nodes (``kwok.KwokNodes``) and real
nodes (``realnodes.RealNodes``: kubelet, containerd, runc) can run side by side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.devcluster.pki import Pki, issue, write_kubeconfig
from gpufleet.kube import Obj
from gpufleet.spec import DEFAULT_RDMA_RESOURCE

if TYPE_CHECKING:
    from gpufleet.devcluster.api import Api
    from gpufleet.devcluster.processes import Processes


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A pool of nodes: count, GPUs each and their product (GPU feature discovery labels), the
    name prefix and extra labels (a chart flavor's nodeLabels, topology)."""

    count: int = 2
    gpus: int = 2
    gpu_product: str = "NVIDIA-A30"
    gpu_memory_mib: int = 24576
    cpu: str = "32"
    memory: str = "256Gi"
    prefix: str = "gpu-node"
    labels: tuple[tuple[str, str], ...] = ()
    # Extended resources beside the GPUs (an RDMA device plugin's shared devices).
    extra: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """ "3 gpu-nodes x 4 NVIDIA-A30", for the user."""
        gpus = f" x {self.gpus} {self.gpu_product}" if self.gpus else ""
        return f"{self.count} {self.prefix}s{gpus}"


def pools_from_values(
    values: dict[str, Any], count: int, gpus: int, gpu_product: str
) -> list[NodeSpec]:
    """Node pools for a platform chart values file: ``count`` nodes per flavor, carrying the
    flavor's nodeLabels (so Kueue's ResourceFlavors match them), GPUs on GPU flavors (product
    from the flavor's nvidia.com/gpu.product label, else ``gpu_product``), and a label for every
    topology level the chart's Kueue Topology names, nodes spread over two values of each; on
    GPU flavors, RDMA devices (rdma.resourceName) when a tenant uses RDMA (the chart's design:
    InfiniBand on the GPU nodes)."""
    topology = (values.get("kueue") or {}).get("topology") or {}
    levels = [lv for lv in topology.get("levels", []) if lv != "kubernetes.io/hostname"]
    flavors = values.get("flavors") or [{"name": "default", "gpu": gpus > 0, "nodeLabels": {}}]
    rdma = any(t.get("rdma") for t in values.get("tenants") or [])
    resource = (values.get("rdma") or {}).get("resourceName", DEFAULT_RDMA_RESOURCE)
    device = (resource, RDMA_SHARED_DEVICES)
    pools = []
    for flavor in flavors:
        labels = dict(flavor.get("nodeLabels") or {})
        product = labels.get("nvidia.com/gpu.product", gpu_product)
        pools.append(NodeSpec(count=count, gpus=gpus if flavor.get("gpu") else 0,
                              gpu_product=product, prefix=f"{flavor['name']}-node",
                              labels=tuple(sorted(labels.items())) + tuple(
                                  (lv, "") for lv in levels),
                              extra=(device,) if rdma and flavor.get("gpu") else ()))  # fmt: skip
    return pools


GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}  # GPU nodes carry it
# The RDMA devices a GPU node advertises when the values' tenants use RDMA (the shared device
# plugin's count: pods share the node's adapters).
RDMA_SHARED_DEVICES = "64"


def node_labels(pool: NodeSpec, index: int) -> dict[str, str]:
    """Node ``index`` of ``pool``'s labels: its zone, GPU feature discovery's labels on GPU
    pools, the pool's own (a topology level without a value: nodes spread over two)."""
    labels = {"topology.kubernetes.io/zone": f"zone-{index % 2}"}
    if pool.gpus:
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": pool.gpu_product,
            "nvidia.com/gpu.count": str(pool.gpus),
            "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
        }
    for key, value in pool.labels:
        labels[key] = value or f"{key.rsplit('/', 1)[-1]}-{index % 2}"
    return labels


@dataclass(frozen=True)
class NodeContext:
    """What a kind of node gets from the cluster it joins."""

    binaries: Path  # the built executables (build.binaries_dir())
    directory: Path  # the cluster's state directory; each kind keeps its files under it
    kubeconfig: Callable[[str], Path]  # a kubeconfig for a client of the cluster's PKI
    api: Api
    pki: Pki
    server: str  # the API server's URL

    def issue_client(self, user: str, name: str, groups: tuple[str, ...] = ()) -> Path:
        """A client certificate for ``name`` (in ``groups``) and its kubeconfig,
        ``<directory>/<user>.kubeconfig``."""
        issue(self.pki, user, name, groups)
        return write_kubeconfig(self.kubeconfig(user), self.server, self.pki, user)


class NodeKind(Protocol):
    """A kind of node: fake (kwok.KwokNodes) or real (realnodes.RealNodes); one module each.
    A cluster has one or more kinds side by side."""

    @property
    def pools(self) -> list[NodeSpec]:
        """The pools its nodes form."""

    @property
    def api_address(self) -> str:
        """Where the API server must listen for these nodes (kwok: 127.0.0.1)."""

    def prepare(self, directory: Path, log: Callable[[str], None]) -> None:
        """Host changes before the control plane starts, recorded so ``down`` undoes them."""

    def objects(self) -> list[Obj]:
        """What is created through the API before its processes start (kwok: the Nodes)."""

    def start(self, ctx: NodeContext, processes: Processes, timeout: float) -> None:
        """Start its processes once the control plane is ready; return when every node of
        this kind is Ready."""
