"""The real nodes' network: each node is a network namespace of its own, joined to the host by a
veth pair on one host bridge, as separate hosts on one switch. Every address here is on this
machine only: the host bridge has no uplink, the nodes have no default route, and the host does
not forward (its ``ip_forward`` is left as it is), so no packet of a pod leaves the machine.

    host (API server, CoreDNS)  gpufleet0  10.250.0.1/24
    node i (kubelet, containerd, kube-proxy, its pods)  eth0  10.250.0.(11+i), pods 10.245.i.0/24

Pods reach pods on other nodes through routes between the nodes' addresses, Services through
kube-proxy's rules inside each node's namespace, the API server and CoreDNS on the bridge's
address."""

from __future__ import annotations

import ipaddress
import subprocess

from gpufleet.devcluster.realnodes.host import HostChanges

BRIDGE = "gpufleet0"
NODE_NET = ipaddress.ip_network("10.250.0.0/24")
HOST_IP = str(NODE_NET[1])  # the API server and CoreDNS listen here for the nodes and pods
POD_NET = ipaddress.ip_network("10.245.0.0/16")  # real pods; kwok's are in 10.244.0.0/16
FIRST_NODE_HOST = 11
MAX_NODES = 200


def node_ip(index: int) -> str:
    return str(NODE_NET[FIRST_NODE_HOST + index])


def pod_cidr(index: int) -> str:
    return str(list(POD_NET.subnets(new_prefix=24))[index])


def netns_name(node: str) -> str:
    return f"gpufleet-{node}"


def host_side(index: int) -> str:
    """The host's end of node ``index``'s veth pair, on the bridge."""
    return f"gfv{index}"


def ip(*args: str, netns: str | None = None) -> None:
    """Run iproute2's ``ip`` (in ``netns`` when given); a failure is a ClusterUpError."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    run(*argv)


def in_netns(netns: str, *argv: str) -> None:
    run("ip", "netns", "exec", netns, *argv)


def run(*argv: str) -> None:
    """Run a host command; a failure is a ClusterUpError with its error output."""
    from gpufleet.errors import ClusterUpError

    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterUpError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def make_bridge(changes: HostChanges) -> None:
    """The host bridge and its address (recorded before it is made, so ``undo`` removes it
    even when ``up`` dies halfway)."""
    changes.add_link(BRIDGE)
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{HOST_IP}/{NODE_NET.prefixlen}", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")


def make_node_netns(changes: HostChanges, node: str, index: int, count: int) -> str:
    """Node ``index``'s namespace: eth0 with its address on the bridge, loopback, forwarding
    on (inside the namespace only), bridged traffic through its netfilter rules (kube-proxy),
    routes to the other nodes' pods; the host's route to its pods. Returns the namespace."""
    netns = netns_name(node)
    host_end = host_side(index)
    changes.add_netns(netns)
    ip("netns", "add", netns)
    changes.add_link(host_end)
    ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", host_end, "master", BRIDGE, "up")
    ip("link", "set", "lo", "up", netns=netns)
    ip("addr", "add", f"{node_ip(index)}/{NODE_NET.prefixlen}", "dev", "eth0", netns=netns)
    ip("link", "set", "eth0", "up", netns=netns)
    for key in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
        in_netns(netns, "sysctl", "-q", "-w", key)
    for other in range(count):
        if other != index:
            ip("route", "add", pod_cidr(other), "via", node_ip(other), netns=netns)
    ip("route", "add", pod_cidr(index), "via", node_ip(index), "dev", BRIDGE)
    return netns
