"""JobSet: groups of Jobs with a shared lifecycle and headless Service. Configured by its
module's ConfigMap; its rotation checks a fixed /tmp path, so it runs in its cert-manager mode
and the local cluster issues its serving certificate (cert-manager's part)."""

from __future__ import annotations

from gpufleet.devcluster.addons.base import Addon, Certs

JOBSET = Addon(
    name="jobset",
    project="jobset",
    namespace="jobset-system",
    service_account="jobset-controller-manager",
    certs=Certs.ISSUED,
    webhook_service="jobset-webhook-service",
    probe={
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "gpufleet-webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "probe",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "probe"}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    },
)
