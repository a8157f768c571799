"""``gpufleet doctor``: what a cluster lacks for gpufleet, one line per check, before a job
finds out by staying Pending. ``requirements`` holds what is needed (the one home of minimum
versions and the controllers' names), ``facts`` reads the cluster once, ``controllers`` and
``platform`` and ``workloads`` (the chart's own) are the pure checks, ``findings`` the lines."""

from __future__ import annotations

from gpufleet.cluster.doctor.controllers import (
    controller_findings,
    in_scope,
    kubernetes_version,
    kueue_integrations,
    kueue_pods_ready,
)
from gpufleet.cluster.doctor.facts import Facts, gather
from gpufleet.cluster.doctor.findings import Finding, Status
from gpufleet.cluster.doctor.platform import (
    cluster_dns,
    default_storage_class,
    device_plugin,
    gpu_nodes,
    prometheus_operator,
    rdma,
    tenant_pod_security,
)
from gpufleet.cluster.doctor.requirements import TARGET_NEEDS
from gpufleet.cluster.doctor.workloads import chart_workloads


def diagnose(facts: Facts, targets: list[str]) -> list[Finding]:
    """Every check on ``facts``; ``targets``: the render targets the team uses (every
    controller they need must run), or none: each installed target's."""
    controllers, used = in_scope(facts, targets)
    optional = [f for f in (rdma(facts),) if f is not None]
    return [
        kubernetes_version(facts),
        *controller_findings(facts, controllers, named=bool(targets)),
        kueue_integrations(facts, used),
        kueue_pods_ready(facts),
        *gpu_nodes(facts),
        device_plugin(facts),
        default_storage_class(facts),
        tenant_pod_security(facts),
        cluster_dns(facts),
        prometheus_operator(facts),
        *chart_workloads(facts),
        *optional,
    ]


__all__ = ["TARGET_NEEDS", "Facts", "Finding", "Status", "diagnose", "gather"]
