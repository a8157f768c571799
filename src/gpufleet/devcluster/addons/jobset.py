"""JobSet: groups of Jobs with a shared lifecycle and headless Service. Configured by its
module's ConfigMap; its rotation checks a fixed /tmp path, so it runs in its cert-manager mode
and the local cluster issues its serving certificate (cert-manager's part)."""

from __future__ import annotations

from gpufleet.cluster.doctor.requirements import JOBSET_MANAGER
from gpufleet.devcluster.addons.base import Addon, Certs

JOBSET = Addon(
    name="jobset",
    project="jobset",
    namespace="jobset-system",
    service_account="jobset-controller-manager",
    certs=Certs.ISSUED,
    webhook_service=JOBSET_MANAGER.webhook_service,
    probe=JOBSET_MANAGER.probe,
)
