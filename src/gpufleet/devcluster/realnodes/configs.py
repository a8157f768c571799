"""A real node's configuration files: containerd's (CRI with runc and the CNI plugins), the CNI
network, the kubelet's and kube-proxy's (KubeletConfiguration, KubeProxyConfiguration), and the
cluster DNS's Corefile. Each is what the component's own documentation gives for a node with
cgroup v1, no systemd as PID 1, and nftables; every path is the node's own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.cluster.doctor.requirements import DNS_NAMESPACE, DNS_SELECTOR
from gpufleet.devcluster.realnodes import network

SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.2"  # containerd 2.4's pinned sandbox image
CLUSTER_DOMAIN = "cluster.local"
DNS_SERVICE = "kube-dns"  # its name in every kubeadm cluster, CoreDNS or kube-dns
KUBELET_PORT = 10250
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# The free disk below which a node reports DiskPressure and evicts (its kubelet's evictionHard).
EVICTION_DISK_FREE = "1Gi"


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps its files: ``run`` (sockets and runtime state, short paths: a
    socket's path has at most 107 bytes), ``data`` (the kubelet's root and pod logs, on disk),
    ``cache`` (containerd's content and snapshots, kept across clusters like a build cache)."""

    run: Path
    data: Path
    cache: Path

    @property
    def containerd_root(self) -> Path:
        """containerd's store: content, and the overlayfs snapshotter's ``snapshots/<id>/fs``."""
        return self.cache / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.data / "kubelet"


def _toml(value: str | bool | int | list[str]) -> str:
    return json.dumps(value)  # TOML's basic strings, booleans, integers and arrays are JSON's


def containerd_config(paths: NodePaths, binaries: Path, cni_bin: Path) -> str:
    """containerd's config (version 3): its root and state, the CRI plugin with runc from
    ``binaries``, the CNI plugins in ``cni_bin``, the pause image pinned, pod network
    namespaces under its state (not /run/netns), and ``restrict_oom_score_adj``: processes
    here lack CAP_SYS_RESOURCE, and runc cannot lower a score without it."""
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{runtime}.containerd.runtimes.runc"
    lines = [
        "version = 3",
        f"root = {_toml(str(paths.containerd_root))}",
        f"state = {_toml(str(paths.run / 'containerd'))}",
        "[grpc]",
        f"  address = {_toml(str(paths.containerd_socket))}",
        "[ttrpc]",
        f"  address = {_toml(str(paths.run / 'containerd.sock.ttrpc'))}",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {_toml(SANDBOX_IMAGE)}",
        f"[{runtime}]",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  enable_cdi = false",
        f"[{runtime}.cni]",
        f"  bin_dirs = {_toml([str(cni_bin)])}",
        f"  conf_dir = {_toml(str(paths.run / 'cni'))}",
        f"[{runc}]",
        "  runtime_type = 'io.containerd.runc.v2'",
        f"[{runc}.options]",
        f"  BinaryName = {_toml(str(binaries / 'runc'))}",
        f"  Root = {_toml(str(paths.run / 'runc'))}",
        "  SystemdCgroup = false",
        "[plugins.'io.containerd.grpc.v1.cri']",
        "  stream_server_address = '127.0.0.1'",  # inside the node's network namespace
    ]
    return "\n".join(lines) + "\n"


def cni_network(paths: NodePaths, index: int) -> dict[str, Any]:
    """The node's pod network: a bridge in its namespace with its pods' /24 (host-local's
    leases kept in the node's directory), no masquerade, ports mapped with nftables."""
    return {
        "cniVersion": "1.0.0",
        "name": "gpufleet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                # No masquerade: a pod reaches the others and the host by its own address
                # (every node and the host route each pod /24), so the network policies of the
                # pod it reaches see its source (masqueraded, it was the node's address).
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.pod_cidr(index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.run / "cni-ipam"),
                },
            },
            {"type": "portmap", "backend": "nftables", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    paths: NodePaths, node: str, index: int, ca: Path, taints: list[dict[str, str]]
) -> str:
    """The kubelet's configuration: cgroup v1 allowed (``failCgroupV1: false``) with the
    cgroupfs driver under the node's own cgroup root, webhook authentication and authorization
    (no anonymous access), the cluster DNS on the host bridge, pod logs in the node's
    directory, and image garbage collection off (no registry: an image removed cannot be
    pulled again)."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_of(node)}",
        "address": network.node_ip(index),
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [network.HOST_IP],
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.data / "pod-logs"),
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Disk thresholds as amounts, not shares: the nodes share the host's disk, and a share of
        # what it reports (a thin-provisioned 252 GB here, ~92 GB usable) put the threshold at
        # 5 GB: a host with less free marked every node DiskPressure, and each pod of the suite
        # waited for its timeout (a CI run past its 90 minutes). kind sets 0 %; 1 GiB still
        # evicts before the disk is full.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": EVICTION_DISK_FREE,
            "imagefs.available": EVICTION_DISK_FREE,
        },
        "evictionPressureTransitionPeriod": "30s",
        "registerWithTaints": taints,
        "serializeImagePulls": False,
        "resolvConf": "",
    }
    return yaml.safe_dump(config, sort_keys=False)


def cgroup_of(node: str) -> str:
    """The node's cgroup root, relative to each hierarchy (its runtime's below it)."""
    return f"gpufleet/{node}"


def kube_proxy_config(kubeconfig: Path, node: str) -> str:
    """kube-proxy in nftables mode inside the node's namespace; it leaves conntrack's global
    limits alone (maxPerCore 0)."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "clusterCIDR": str(network.POD_NET),
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    return yaml.safe_dump(config, sort_keys=False)


def corefile(kubeconfig: Path, ready_port: int, port: int = 53) -> str:
    """CoreDNS on the host bridge: the cluster's names only (no ``forward``: a pod's query for
    any other name gets no answer from outside; nothing leaves the machine)."""
    return (
        f".:{port} {{\n"
        f"    bind {network.HOST_IP}\n"
        "    errors\n"
        f"    ready 127.0.0.1:{ready_port}\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "    }\n"
        "    cache 30\n"
        "}\n"
    )


def dns_service(port: int = 53) -> list[dict[str, Any]]:
    """The cluster DNS as a cluster's own is found (kube-system, label k8s-app=kube-dns):
    CoreDNS runs on the host bridge, not in a pod, so a Service without selector, headless
    (the kubelets give pods the bridge address itself), and its EndpointSlice there."""
    key, value = DNS_SELECTOR.split("=")
    ports = [{"name": f"dns-{p.lower()}", "port": port, "protocol": p} for p in ("UDP", "TCP")]
    meta = {"name": DNS_SERVICE, "namespace": DNS_NAMESPACE, "labels": {key: value}}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"clusterIP": "None", "ports": ports},
    }
    slice_labels = {
        "kubernetes.io/service-name": DNS_SERVICE,
        "endpointslice.kubernetes.io/managed-by": "gpufleet.dev",
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {**meta, "name": f"{DNS_SERVICE}-host", "labels": slice_labels},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [{"addresses": [network.HOST_IP], "conditions": {"ready": True}}],
    }
    return [service, endpoints]
