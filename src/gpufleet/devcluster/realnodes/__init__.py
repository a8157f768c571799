"""Real nodes (``gpufleet cluster up --real-nodes N``): each a real kubelet with containerd,
runc and the CNI plugins built from their Go modules, in a network namespace of its own on one
host bridge (``network``), with kube-proxy; cluster DNS by CoreDNS on the host. Pods run real
containers from images imported with no registry (``images``). Every change to the host is
recorded before it is made and undone by ``down`` (``host``).

The modules: ``network`` (addresses, bridge, namespaces), ``host`` (the journal and ``undo``),
``configs`` (each component's configuration), ``node`` (one node's files and processes),
``images`` (OCI archives, the pause image), ``kind`` (RealNodes, the NodeKind)."""

from gpufleet.devcluster.realnodes.kind import RealNodes, real_pools

__all__ = ["RealNodes", "real_pools"]
