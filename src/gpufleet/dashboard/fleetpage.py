"""The fleet page: nodes and GPUs by product, allocated against free, and who holds them.

Allocation is what the scheduler has placed: the ``nvidia.com/gpu`` requests of the pods bound
to a node that have not ended (every pod's, gpufleet's or not), against the node's
allocatable GPUs. Pure functions over the API's nodes and pods; one list of each per refresh.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpufleet.cluster.status import ENDED
from gpufleet.kube import Obj
from gpufleet.render.podspec import GPU_PRODUCT_LABEL as PRODUCT_LABEL
from gpufleet.render.podspec import GPU_RESOURCE as GPU


@dataclass
class NodeGpus:
    """One node: its GPU product, how many it offers and how many pods hold."""

    name: str
    product: str
    gpus: int
    allocated: int
    ready: bool
    schedulable: bool


@dataclass
class ProductGpus:
    """Every node of one GPU product, summed."""

    product: str
    nodes: int
    gpus: int
    allocated: int

    @property
    def free(self) -> int:
        return max(0, self.gpus - self.allocated)

    @property
    def allocated_percent(self) -> float:
        return 100.0 * self.allocated / self.gpus if self.gpus else 0.0


@dataclass
class FleetGpus:
    """The fleet page's numbers."""

    nodes: list[NodeGpus] = field(default_factory=list)
    products: list[ProductGpus] = field(default_factory=list)
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)  # namespace -> product -> n


def _quantity(value: object) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0


def pod_gpus(pod: Obj) -> int:
    """The GPUs a pod holds: its containers' requests (limits where no request is given; for
    extended resources Kubernetes requires them equal), its init containers' largest."""
    spec = pod.get("spec") or {}

    def of(container: Obj) -> int:
        resources = container.get("resources") or {}
        wanted = (resources.get("requests") or {}).get(
            GPU, (resources.get("limits") or {}).get(GPU)
        )
        return _quantity(wanted)

    main = sum(of(c) for c in spec.get("containers") or [])
    return max([main, *(of(c) for c in spec.get("initContainers") or [])])


def fleet_gpus(nodes: list[Obj], pods: list[Obj]) -> FleetGpus:
    """Nodes with GPUs (or holding GPU pods), by product, and the GPUs each namespace holds."""
    held: dict[str, int] = defaultdict(int)
    tenants: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    product_of = {n["metadata"]["name"]: str((n["metadata"].get("labels") or {}).get(
        PRODUCT_LABEL, "-")) for n in nodes}  # fmt: skip
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        gpus = pod_gpus(pod)
        if node and gpus and (pod.get("status") or {}).get("phase") not in ENDED:
            held[node] += gpus
            ns = pod["metadata"].get("namespace", "")
            tenants[ns][product_of.get(node, "-")] += gpus
    out = FleetGpus(tenants={ns: dict(p) for ns, p in sorted(tenants.items())})
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        gpus = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU))
        if not gpus and not held.get(name):
            continue
        conditions = {c.get("type"): c.get("status") for c in
                      (node.get("status") or {}).get("conditions") or []}  # fmt: skip
        out.nodes.append(NodeGpus(name, product_of[name], gpus, held.get(name, 0),
                                  conditions.get("Ready") == "True",
                                  not (node.get("spec") or {}).get("unschedulable")))  # fmt: skip
    by_product: dict[str, ProductGpus] = {}
    for n in out.nodes:
        p = by_product.setdefault(n.product, ProductGpus(n.product, 0, 0, 0))
        p.nodes, p.gpus, p.allocated = p.nodes + 1, p.gpus + n.gpus, p.allocated + n.allocated
    out.products = sorted(by_product.values(), key=lambda p: p.product)
    return out
