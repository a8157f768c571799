"""The local control plane: real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built from their Go modules, and kwok for fake GPU nodes. See ``cluster``."""

from gpufleet.devcluster.cluster import LocalCluster, NodeSpec, State

__all__ = ["LocalCluster", "NodeSpec", "State"]
