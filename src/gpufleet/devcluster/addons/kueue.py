"""Kueue: job queueing, quotas, cohorts and preemption. Configured by its module's ConfigMap;
its own certificate rotation writes its serving certificate to a Secret (its default)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufleet.cluster.doctor.requirements import KUEUE_MANAGER, KUEUE_SETTINGS
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

# What gpufleet expects of Kueue's configuration, as the chart documents it for a cluster's
# Kueue (all-or-nothing admission, the resource metrics, the integrations), in the checkout:
# the local cluster runs Kueue with its waitForPodsReady and metrics.
CHART_KUEUE_CONFIG = Path(KUEUE_SETTINGS)

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


@dataclass(frozen=True)
class KueueSettings:
    """What `cluster up` may change of gpufleet's Kueue settings."""

    fair_sharing: bool = False
    # waitForPodsReady's timeout and recoveryTimeout both (a test's seconds; None: the chart's)
    pods_ready_timeout: str | None = None


def chart_kueue_config() -> dict[str, Any]:
    """The chart's documented Kueue settings (CHART_KUEUE_CONFIG in the checkout)."""
    from gpufleet.devcluster.build import REPO  # it imports the addons

    path = REPO / CHART_KUEUE_CONFIG
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a mapping")
    return loaded


def kueue_config(docs: list[Obj], running: list[Addon], settings: KueueSettings) -> dict[str, Any]:
    """What the local cluster sets in Kueue's configuration beyond its module's: the chart's
    waitForPodsReady (its timeouts from ``settings`` when given), resources and metrics,
    fair sharing when asked, the integrations of the controllers in ``running``."""
    chart = chart_kueue_config()
    wait = copy.deepcopy(chart["waitForPodsReady"])
    if settings.pods_ready_timeout is not None:
        wait["timeout"] = wait["recoveryTimeout"] = settings.pods_ready_timeout
    return (
        {"waitForPodsReady": wait, "metrics": chart["metrics"], "resources": chart["resources"]}
        | (KUEUE_FAIR_SHARING if settings.fair_sharing else {})
        | kueue_frameworks(docs, running)
    )
