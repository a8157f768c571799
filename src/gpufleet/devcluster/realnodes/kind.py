"""The ``NodeKind`` of real nodes: host preparation, the RBAC of kube-proxy, CoreDNS and
kube-router, and the start of CoreDNS and of each node's containerd, kubelet, kube-proxy and
kube-router (its firewall: NetworkPolicies enforced); the metrics pipeline when asked."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devcluster.api import wait
from gpufleet.devcluster.components import Component, _get
from gpufleet.devcluster.nodes import GPU_TAINT, NodeContext, NodeSpec, node_labels
from gpufleet.devcluster.processes import Processes
from gpufleet.devcluster.realnodes import configs, host, images, network, storage
from gpufleet.devcluster.realnodes.host import DATA_ROOT, RUN_ROOT, HostChanges
from gpufleet.devcluster.realnodes.metrics import MetricsPipeline
from gpufleet.devcluster.realnodes.node import RealNode
from gpufleet.errors import ClusterUpError
from gpufleet.kube import Obj
from gpufleet.net import free_ports

KUBE_PROXY_USER = "system:kube-proxy"  # bound to the built-in ClusterRole system:node-proxier
COREDNS_USER = "gpufleet:coredns"
# What CoreDNS's kubernetes plugin reads (its documented RBAC).
COREDNS_RULES = [
    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
     "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["list", "watch"]},
]  # fmt: skip
ROUTER_USER = "gpufleet:kube-router"
# What kube-router's network policy controller watches (its documented RBAC, less what its
# router and service proxy need: they do not run here).
ROUTER_RULES = [
    {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["get", "list", "watch"]},
]  # fmt: skip


def node_cache() -> Path:
    """Where nodes keep containerd's store across clusters: $GPUFLEET_NODE_CACHE, else
    ~/.cache/gpufleet/nodes."""
    default = Path.home() / ".cache" / "gpufleet" / "nodes"
    return Path(os.environ.get("GPUFLEET_NODE_CACHE", default))


def real_pools(pools: NodeSpec | list[NodeSpec], count: int) -> list[NodeSpec]:
    """Pools of real nodes shaped as the fake ``pools`` (GPUs, product, labels): ``count`` in
    the first (GPU) pool, named real-<prefix>."""
    listed = pools if isinstance(pools, list) else [pools]
    first = next((p for p in listed if p.gpus), listed[0])
    return [dataclasses.replace(first, count=count, prefix=f"real-{first.prefix}")]


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterUpError(
            "real nodes change the host (network namespaces, cgroups, mounts): run "
            "`gpufleet cluster up --real-nodes N` as root"
        )


@dataclass
class RealNodes:
    """Real nodes in pools (GPUs advertised as extended resources, labelled as GPU feature
    discovery would, so GPU jobs schedule here and run on the CPU); ``images``: OCI archives
    imported into every node besides the pause image; ``metrics``: the metrics pipeline
    (metrics.py) too."""

    pools: list[NodeSpec]
    images: list[Path] = field(default_factory=list)
    metrics: bool = False
    _pipeline: MetricsPipeline | None = None
    api_address: str = network.HOST_IP
    _nodes: list[tuple[RealNode, NodeSpec]] = field(default_factory=list)
    volumes_dir: Path = Path()  # set by prepare: <cluster dir>/volumes

    def __post_init__(self) -> None:
        count = sum(p.count for p in self.pools)
        if count > network.MAX_NODES:
            raise ClusterUpError(f"at most {network.MAX_NODES} real nodes")

    def prepare(self, directory: Path, log: Callable[[str], None]) -> None:
        """Host changes before the control plane starts (the API server listens on the
        bridge): the bridge, each node's namespace, directories and cgroups; first, what a
        cluster that was never stopped left undone (host.undo_orphan)."""
        require_root()
        host.undo_orphan(directory, log)
        changes = HostChanges(directory / host.JOURNAL, cluster=str(directory))
        self.volumes_dir = directory / "volumes"
        self._pipeline = MetricsPipeline(directory) if self.metrics else None
        changes.remember_fixed_paths()
        changes.remember_sysctls()
        network.make_bridge(changes)
        changes.add_mount_root(self.volumes_dir)
        storage.make_dirs(self.volumes_dir)
        names = [(f"{pool.prefix}-{i}", pool) for pool in self.pools for i in range(pool.count)]
        run_root = Path(RUN_ROOT)
        for index, (name, pool) in enumerate(names):
            paths = configs.NodePaths(run=run_root / name, data=Path(DATA_ROOT) / name,
                                      cache=node_cache() / name)  # fmt: skip
            node = RealNode(name, index, len(names), paths)
            node.prepare(changes)
            self._nodes.append((node, pool))

    def objects(self) -> list[Obj]:
        """The RBAC of kube-proxy, CoreDNS and kube-router; the cluster DNS's Service; the shared
        volumes (storage.py)."""
        return [
            _binding("gpufleet:kube-proxy", "system:node-proxier", KUBE_PROXY_USER),
            _role(COREDNS_USER, COREDNS_RULES),
            _binding(COREDNS_USER, COREDNS_USER, COREDNS_USER),
            *configs.dns_service(),
            _role(ROUTER_USER, ROUTER_RULES),
            _binding(ROUTER_USER, ROUTER_USER, ROUTER_USER),
            *storage.shared_volumes(self.volumes_dir, [n.name for n, _ in self._nodes]),
        ]

    def start(self, ctx: NodeContext, processes: Processes, timeout: float) -> None:
        """CoreDNS; then each node's containerd (images imported), kubelet, kube-proxy and
        kube-router; then its GPUs and labels, once it registered; ready when every node is
        Ready; then the metrics pipeline, if asked for."""
        if self._pipeline is not None:
            self._pipeline.check(ctx.binaries)
        processes.start(self._coredns(ctx), timeout)
        cni_bin = _cni_bin(ctx)
        archives = [images.pause_archive(ctx.binaries), *self.images]
        proxy = ctx.issue_client("kube-proxy", KUBE_PROXY_USER)
        router = ctx.issue_client("kube-router", ROUTER_USER)
        for node, pool in self._nodes:
            taints = [GPU_TAINT] if pool.gpus else []
            node.write_configs(ctx, cni_bin, proxy, taints)
            processes.start(node.containerd(ctx.binaries), timeout)
        import_all(ctx.binaries, [node for node, _ in self._nodes], archives, processes.log)
        for node, _ in self._nodes:
            processes.start(node.kubelet(ctx.binaries, self._registered(ctx, node)), timeout)
            processes.start(node.kube_proxy(ctx.binaries), timeout)
        for node, pool in self._nodes:
            self._advertise(ctx, node, pool)
        for node, _ in self._nodes:  # once registered: it reads its own Node
            processes.start(node.kube_router(ctx.binaries, router), timeout)
        names = [node.name for node, _ in self._nodes]
        wait(lambda: ctx.api.nodes_ready(names), "real nodes", timeout, processes.log)
        if self._pipeline is not None:
            self._pipeline.start(ctx, processes, len(names), timeout)

    def _coredns(self, ctx: NodeContext) -> Component:
        kubeconfig = ctx.issue_client("coredns", COREDNS_USER)
        (ready_port,) = free_ports(1, cluster=True)
        path = ctx.directory / "Corefile"
        path.write_text(configs.corefile(kubeconfig, ready_port))
        argv = [str(ctx.binaries / "coredns"), "-conf", str(path)]
        return Component("coredns", argv, lambda: _get(f"http://127.0.0.1:{ready_port}/ready"))

    @staticmethod
    def _registered(ctx: NodeContext, node: RealNode) -> Callable[[], bool]:
        def registered() -> bool:
            from gpufleet.cluster.apierrors import api_errors

            try:
                ctx.api.core().read_node(node.name)
            except api_errors():
                return False
            return True

        return registered

    @staticmethod
    def _advertise(ctx: NodeContext, node: RealNode, pool: NodeSpec) -> None:
        """The pool's labels (GPU discovery's, topology's) and its GPUs as an extended
        resource in the node's capacity (Kubernetes' documented way to advertise one without
        a device plugin)."""
        core = ctx.api.core()
        core.patch_node(node.name, {"metadata": {"labels": node_labels(pool, node.index)}})
        if pool.gpus:
            capacity: dict[str, Any] = {"nvidia.com/gpu": str(pool.gpus)}
            core.patch_node_status(node.name, {"status": {"capacity": capacity}})


def _role(name: str, rules: list[Obj]) -> Obj:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules}  # fmt: skip


def _binding(name: str, role: str, user: str) -> Obj:
    """A ClusterRoleBinding of ClusterRole ``role`` to the User ``user``."""
    group = "rbac.authorization.k8s.io"
    return {"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": group, "kind": "User", "name": user}]}  # fmt: skip


def _cni_bin(ctx: NodeContext) -> Path:
    """The CNI plugins under the names containerd looks for (the build names them cni-*)."""
    where = ctx.directory / "cni-bin"
    where.mkdir(exist_ok=True)
    for plugin in configs.CNI_PLUGINS:
        link = where / plugin
        if not link.is_symlink():
            link.symlink_to(ctx.binaries / f"cni-{plugin}")
    return where


def import_all(binaries: Path, nodes: list[RealNode], archives: list[Path],
               log: Callable[[str], None]) -> None:  # fmt: skip
    """The archives' images into every node, one node after the other; then, if any was
    imported, the nodes' layers stored once (images.share_files). Not side by side: an import
    holds the archive's compressed layers in the node's store until they are unpacked (3.5 GB
    for the project's image): one node at a time holds them once, where the disk is tight,
    and one disk gains little from two writers."""
    started = time.monotonic()
    imported = [_import(binaries, node, archives) for node in nodes]
    log(f"  images imported ({time.monotonic() - started:.1f} s)")
    if any(imported):
        layers = [d for node in nodes for d in node.layer_dirs(binaries)]
        log(f"  layers the nodes share: {images.share_files(layers)}")


def _import(binaries: Path, node: RealNode, archives: list[Path]) -> bool:
    """The archives' images into the node; other builds of the project's images go first, so
    the node's store never holds two builds of one (7 GB each, unpacked; the disk ran out with
    both). Whether it imported any."""
    node.drop_other_builds(binaries, [n for a in archives for n in images.names_in(a)])
    return any([node.import_image(binaries, archive) for archive in archives])
