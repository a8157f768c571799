"""A real node's power cut and its return (``gpufleet cluster crash-node | start-node``), to see
what the platform does when a node is lost, as a GPU server that loses power or its switch port.

``crash``: the node's wire is cut first (its veth on the host bridge goes down: no peer gets a
FIN or RST from it, as none does from a dead server), then its kubelet, kube-proxy, containerd,
the shims and every container are killed at once (SIGKILL). The API server keeps its Node and
pods as they were, until the node controller sees no heartbeat. ``start``: the wire back, then
containerd, the kubelet and kube-proxy started again from the node's configuration, as after a
reboot: the kubelet finds its pods gone and reports so; containerd's store (images) is kept.

``partition``: the pod network between nodes cut, the nodes themselves left as they are (their
kubelets keep reporting, they stay Ready, the API server still reaches every pod): each node
routes the others' pod addresses to a blackhole, so every packet between their pods is dropped
without a word, as by a failed switch between two racks. ``heal`` puts the routes back. Both
live in the nodes' namespaces, so ``down`` undoes them with the namespaces."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from gpufleet.devcluster.processes import Processes
from gpufleet.devcluster.realnodes import configs, network
from gpufleet.devcluster.realnodes.host import DATA_ROOT, RUN_ROOT, HostChanges, kill_cgroup
from gpufleet.devcluster.realnodes.kind import node_cache
from gpufleet.devcluster.realnodes.node import RealNode
from gpufleet.devcluster.state import State
from gpufleet.errors import ClusterUpError, FieldError, UserInputError

START_TIMEOUT_S = 60.0


def _components(name: str) -> tuple[str, ...]:
    """The node's processes as the state names them, in start order."""
    return (f"containerd@{name}", f"kubelet@{name}", f"kube-proxy@{name}")


def real_nodes(directory: Path) -> tuple[list[RealNode], State]:
    """The real nodes of the cluster in ``directory`` (each one's index is its namespace's
    place in the journal of host changes), and the cluster's state."""
    state = State.read(directory)
    changes = HostChanges.load(directory)
    if state is None or changes is None:
        raise ClusterUpError(f"no cluster with real nodes runs from {directory}")
    names = [n.removeprefix(network.netns_name("")) for n in changes.netns]
    nodes = [RealNode(name, index, len(names), configs.NodePaths(
        run=Path(RUN_ROOT) / name, data=Path(DATA_ROOT) / name, cache=node_cache() / name))
        for index, name in enumerate(names)]  # fmt: skip
    return nodes, state


def find_node(directory: Path, name: str, field: str = "NAME") -> tuple[RealNode, State]:
    """Real node ``name`` of the cluster in ``directory``, and the cluster's state."""
    nodes, state = real_nodes(directory)
    for node in nodes:
        if node.name == name:
            return node, state
    known = ", ".join(node.name for node in nodes)
    raise UserInputError([FieldError(field, f"not a real node of this cluster ({known})")])


def crash(directory: Path, name: str) -> int:
    """Cut node ``name``'s wire, then kill all of it at once. Returns how many processes of
    its pods and runtime were killed (the three components besides)."""
    node, state = find_node(directory, name)
    network.ip("link", "set", network.host_side(node.index), "down")
    for component in _components(name):
        if state.alive(component):
            os.killpg(state.pids[component], signal.SIGKILL)
    return kill_cgroup(configs.cgroup_of(name))


def partition(directory: Path, names: list[str], cut: bool) -> list[str]:
    """Drop (``cut``) or route again the packets between the pods of nodes ``names`` (two or
    more distinct real nodes). Returns the nodes' names."""
    if len(set(names)) < 2:
        raise UserInputError([FieldError("NODES", "name two or more distinct real nodes")])
    nodes = [find_node(directory, name, "NODES")[0] for name in dict.fromkeys(names)]
    for node in nodes:
        for other in nodes:
            if other is node:
                continue
            to = network.pod_cidr(other.index)
            route = ["blackhole", to] if cut else [to, "via", network.node_ip(other.index)]
            network.ip("route", "replace", *route, netns=network.netns_name(node.name))
    return [node.name for node in nodes]


def start(directory: Path, name: str, log: Callable[[str], None]) -> None:
    """Bring node ``name`` back: its wire, then containerd, the kubelet and kube-proxy (each
    recorded in the state, so ``down`` stops them)."""
    node, state = find_node(directory, name)
    running = [c for c in _components(name) if state.alive(c)]
    if running:
        raise ClusterUpError(f"{name} is running ({', '.join(running)}): nothing to start")
    binaries = Path(state.binaries)
    network.ip("link", "set", network.host_side(node.index), "up")
    processes = Processes(directory, state, log)
    processes.start(node.containerd(binaries), START_TIMEOUT_S)
    # ready once started: the Node is registered already; it turns Ready with its heartbeat
    processes.start(node.kubelet(binaries, lambda: True), START_TIMEOUT_S)
    processes.start(node.kube_proxy(binaries), START_TIMEOUT_S)
