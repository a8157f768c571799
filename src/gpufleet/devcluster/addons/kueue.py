"""Kueue: job queueing, quotas, cohorts and preemption. Configured by its module's ConfigMap;
its own certificate rotation writes its serving certificate to a Secret (its default)."""

from __future__ import annotations

import copy
from typing import Any

from gpufleet.cluster.doctor.requirements import KUEUE_MANAGER
from gpufleet.devcluster.addons.base import Addon, Certs
from gpufleet.devcluster.addons.manifests import module_config
from gpufleet.kube import Obj

KUEUE = Addon(
    name="kueue",
    project="kueue",
    namespace="kueue-system",
    service_account="kueue-controller-manager",
    certs=Certs.ROTATED,
    webhook_service=KUEUE_MANAGER.webhook_service,
    cert_secret="kueue-webhook-server-cert",
    probe=KUEUE_MANAGER.probe,
    # An unreachable aggregated API (its visibility server) blocks namespace deletion.
    feature_gates=(("VisibilityOnDemand", False),),
    skip_services=("kueue-visibility-server",),
)

# Kueue's quota gauges per ClusterQueue, flavor and resource (cluster_queue_resource_usage,
# _nominal_quota, _borrowing_limit, ...: the Queues dashboard's), off in its default configuration.
KUEUE_METRICS = {"metrics": {"enableClusterQueueResources": True}}

# Kueue's fair sharing among the ClusterQueues of a cohort (off in its default configuration;
# present: on), with the preemption strategies Kueue's documentation shows.
KUEUE_FAIR_SHARING = {
    "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
}


def kueue_frameworks(docs: list[Obj], running: list[Addon]) -> dict[str, Any]:
    """Kueue's ``integrations`` with the frameworks of the controllers in ``running`` added."""
    integrations = copy.deepcopy(module_config(docs).get("integrations", {}))
    frameworks = list(integrations.get("frameworks", []))
    for addon in running:
        frameworks += [f for f in addon.kueue_frameworks if f not in frameworks]
    return {"integrations": {**integrations, "frameworks": frameworks}}


def kueue_config(docs: list[Obj], running: list[Addon], fair_sharing: bool) -> dict[str, Any]:
    """What the local cluster sets in Kueue's configuration beyond its module's: the resource
    metrics, fair sharing when asked, the integrations of the controllers in ``running``."""
    return (
        KUEUE_METRICS
        | (KUEUE_FAIR_SHARING if fair_sharing else {})
        | kueue_frameworks(docs, running)
    )
