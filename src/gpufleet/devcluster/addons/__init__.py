"""The controllers of the local control plane: Kueue, JobSet, the Kubeflow training-operator,
the MPI operator, the Kubeflow Trainer, Volcano, KubeRay and, when asked, Sealed Secrets,
installed from their own modules' manifests (rendered with kustomize or their Helm charts by
scripts/build-controlplane.sh) as a cluster would get them, their managers run as processes
beside the API server (Sealed Secrets' in a mount namespace of its own: addons/sealed.py).

What changes because the managers run beside the API server instead of in pods (what kwokctl
does for its components), and nothing else:

- the Deployments are not applied (the process is started instead), nor Kueue's visibility
  APIService and its Service;
- each webhook Service becomes ``type: ExternalName`` -> 127.0.0.1 on the manager's webhook
  port; the API server resolves it and checks TLS against ``<service>.<namespace>.svc``;
- webhook certificates, in the mode (``Certs``) that needs no fixed path on this machine: a
  manager's own rotation writes a Secret and we do the kubelet's part, copying it to where the
  manager reads it; or the manager runs in cert-manager mode and we do cert-manager's part, a
  serving certificate from the local CA in every webhook's caBundle;
- the manager's configuration (``Config``) is the module's own ConfigMap with loopback
  addresses, its own ports and certificate directory, and its leader-election Lease in its own
  namespace (outside a pod it cannot find one), or its Deployment's flags with the same
  changes; Volcano's controllers and scheduler and KubeRay take their Leases too (their
  Deployments do not, or one replica does not need to), so that `gpufleet doctor` sees a
  manager outside a pod (the training-operator cannot: it is seen by its webhooks); the
  ConfigMap itself is applied with the configuration the manager runs with;
- the manager authenticates with a client certificate carrying its ServiceAccount's user name
  and groups, so the module's own RBAC (bound to that ServiceAccount) is what authorizes it.

One module per controller family; ``base`` is what an addon is, ``manifests`` what of its
manifests is applied, ``process`` how its manager runs.
"""

from gpufleet.devcluster.addons.base import LOOPBACK, Addon, Certs, Config, Ports, Ready
from gpufleet.devcluster.addons.jobset import JOBSET
from gpufleet.devcluster.addons.kubeflow import MPI_OPERATOR, TRAINER, TRAINING_OPERATOR
from gpufleet.devcluster.addons.kuberay import KUBERAY
from gpufleet.devcluster.addons.kueue import (
    CHART_KUEUE_CONFIG,
    KUEUE,
    KUEUE_FAIR_SHARING,
    KueueSettings,
    chart_kueue_config,
    kueue_config,
    kueue_frameworks,
)
from gpufleet.devcluster.addons.manifests import (
    CRD,
    cluster_objects,
    crd_names,
    load_manifests,
    manifest_path,
    module_config,
)
from gpufleet.devcluster.addons.process import (
    FIXED_CERT_CHECK,
    argv,
    cert_dir,
    environment,
    prepare,
    write_certs,
)
from gpufleet.devcluster.addons.sealed import SEALED_SECRETS
from gpufleet.devcluster.addons.volcano import (
    VOLCANO_ADMISSION,
    VOLCANO_CONTROLLERS,
    VOLCANO_SCHEDULER,
)

# In start order: a controller's requirements before it.
ADDONS = (
    KUEUE, JOBSET, TRAINING_OPERATOR, MPI_OPERATOR, TRAINER,
    VOLCANO_ADMISSION, VOLCANO_CONTROLLERS, VOLCANO_SCHEDULER, KUBERAY, SEALED_SECRETS,
)  # fmt: skip
# What `--without` names: a project of several processes (Volcano) is left out whole.
PROJECTS = tuple(dict.fromkeys(a.project for a in ADDONS))
# What `--with` names: the projects that run only when asked.
OPTIONAL = tuple(dict.fromkeys(a.project for a in ADDONS if a.optional))

__all__ = [
    "ADDONS",
    "CHART_KUEUE_CONFIG",
    "CRD",
    "FIXED_CERT_CHECK",
    "JOBSET",
    "KUBERAY",
    "KUEUE",
    "KUEUE_FAIR_SHARING",
    "LOOPBACK",
    "MPI_OPERATOR",
    "OPTIONAL",
    "PROJECTS",
    "SEALED_SECRETS",
    "TRAINER",
    "TRAINING_OPERATOR",
    "VOLCANO_ADMISSION",
    "VOLCANO_CONTROLLERS",
    "VOLCANO_SCHEDULER",
    "Addon",
    "Certs",
    "Config",
    "KueueSettings",
    "Ports",
    "Ready",
    "argv",
    "cert_dir",
    "chart_kueue_config",
    "cluster_objects",
    "crd_names",
    "environment",
    "kueue_config",
    "kueue_frameworks",
    "load_manifests",
    "manifest_path",
    "module_config",
    "prepare",
    "write_certs",
]
