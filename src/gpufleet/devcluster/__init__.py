"""The local control plane behind ``gpufleet cluster up | down | status``: real etcd,
kube-apiserver, kube-controller-manager and kube-scheduler built from their Go modules, nodes
(kwok's fake GPU nodes) and the controllers (``addons``). See ``lifecycle``.

The modules, by concern: ``lifecycle`` (LocalCluster: up = preflight, plan, start; down,
status), ``state`` (state.json), ``build`` (the executables and manifests), ``components`` (a
process's command line and readiness), ``processes`` (start, supervise, stop), ``nodes`` (pools
and the NodeKind a kind of node implements), ``kwok`` (fake nodes and kwok's Stages), ``api``
(the calls ``up`` makes), ``controllers`` (starting the addons), ``pki`` (certificates and
kubeconfigs), ``addons/`` (one module per controller family)."""

from gpufleet.devcluster.lifecycle import LocalCluster
from gpufleet.devcluster.nodes import NodeSpec
from gpufleet.devcluster.state import State

__all__ = ["LocalCluster", "NodeSpec", "State"]
