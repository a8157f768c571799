"""What gpufleet needs of a cluster, as data: the one home of the minimum versions, the
controllers' CRDs, Deployments, leader-election Leases and Kueue integrations that
``gpufleet doctor`` checks (docs/cluster.md's "Controller versions" says the same in prose)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.kube import Obj
from gpufleet.render.podspec import GPU_PRODUCT_LABEL, GPU_RESOURCE

# Kubernetes: the Job's podFailurePolicy (the job target's FailJob rule for fatal exit codes)
# and the JobSet, Kueue and Trainer versions below ask for at least this.
MIN_KUBERNETES = (1, 31)
VERIFIED_KUBERNETES = "v1.36.3"

# Objects of each webhook-serving controller's own kinds, created with dryRun: the API server
# calls its webhooks for them, so success means they answer (doctor; the local cluster's wait).
KUEUE_PROBE: Obj = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ResourceFlavor",
    "metadata": {"name": "gpufleet-webhook-probe"},
}
JOBSET_PROBE: Obj = {
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
}
VOLCANO_PROBE: Obj = {
    "apiVersion": "scheduling.volcano.sh/v1beta1",
    "kind": "Queue",
    "metadata": {"name": "gpufleet-webhook-probe"},
    "spec": {"weight": 1},
}
TRAINING_OPERATOR_PROBE: Obj = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "gpufleet-webhook-probe", "namespace": "default"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "pytorch", "image": "probe"}]}},
            }
        }
    },
}
TRAINER_PROBE: Obj = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "gpufleet-webhook-probe"},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {"containers": [{"name": "node", "image": "probe"}]}
                                }
                            }
                        },
                    }
                ]
            }
        },
    },
}


@dataclass(frozen=True)
class Process:
    """One process of a controller: found running as a ready Deployment of that name (any
    namespace), or by its leader-election Lease renewed lately (a manager outside a pod)."""

    deployment: str
    lease: str = ""  # "": it runs without leader election (its Deployment's default)
    # It serves webhooks, called through this Service: a dry-run create of ``probe`` (an object
    # of its own kinds) must pass them.
    webhook_service: str = ""
    probe: Obj | None = field(default=None, compare=False)  # a dict: kept out of the hash


KUEUE_MANAGER = Process(
    "kueue-controller-manager", "c1f6bfd2.kueue.x-k8s.io", "kueue-webhook-service", KUEUE_PROBE
)
JOBSET_MANAGER = Process(
    "jobset-controller-manager", "6d4f6a47.jobset.x-k8s.io", "jobset-webhook-service", JOBSET_PROBE
)
TRAINING_OPERATOR_MANAGER = Process(
    "training-operator", webhook_service="training-operator", probe=TRAINING_OPERATOR_PROBE
)
TRAINER_MANAGER = Process(
    "kubeflow-trainer-controller-manager",
    "trainer.kubeflow.org",
    "kubeflow-trainer-controller-manager",
    TRAINER_PROBE,
)
MPI_OPERATOR_MANAGER = Process("mpi-operator", "mpi-operator")
VOLCANO_ADMISSION_PROCESS = Process(
    "volcano-admission", webhook_service="volcano-admission-service", probe=VOLCANO_PROBE
)


@dataclass(frozen=True)
class Controller:
    """A controller gpufleet renders for: its CRDs at the versions gpufleet writes, and its
    processes."""

    name: str  # as `gpufleet cluster up --without` and the docs call it
    crds: tuple[tuple[str, str], ...]  # (CRD name, version that must be served)
    processes: tuple[Process, ...]
    verified: str  # the version the tests here run
    # A field of one CRD's schema that is new in the minimum version: (CRD, version, the
    # dotted path under the object, minimum in words).
    marker: tuple[str, str, str, str] | None = None


KUEUE = Controller(
    "kueue",
    crds=tuple(
        (f"{p}.kueue.x-k8s.io", "v1beta2")
        for p in (
            "clusterqueues",
            "localqueues",
            "resourceflavors",
            "workloads",
            "workloadpriorityclasses",
            "topologies",
        )
    ),
    processes=(KUEUE_MANAGER,),
    verified="v0.19.2",
)
JOBSET = Controller(
    "jobset",
    crds=(("jobsets.jobset.x-k8s.io", "v1alpha2"),),
    processes=(JOBSET_MANAGER,),
    verified="v0.12.0",
)
TRAINING_OPERATOR = Controller(
    "training-operator",
    crds=(("pytorchjobs.kubeflow.org", "v1"), ("tfjobs.kubeflow.org", "v1")),
    processes=(TRAINING_OPERATOR_MANAGER,),
    verified="v1.9.3",
)
MPI_OPERATOR = Controller(
    "mpi-operator",
    crds=(("mpijobs.kubeflow.org", "v2beta1"),),
    processes=(MPI_OPERATOR_MANAGER,),
    verified="v0.8.2",
)
TRAINER = Controller(
    "trainer",
    crds=(
        ("trainjobs.trainer.kubeflow.org", "v1alpha1"),
        ("clustertrainingruntimes.trainer.kubeflow.org", "v1alpha1"),
    ),
    processes=(TRAINER_MANAGER,),
    verified="v2.2.1",
    marker=("trainjobs.trainer.kubeflow.org", "v1alpha1", "spec.runtimePatches", "v2.2.0"),
)
VOLCANO = Controller(
    "volcano",
    crds=(
        ("jobs.batch.volcano.sh", "v1alpha1"),
        ("podgroups.scheduling.volcano.sh", "v1beta1"),
        ("queues.scheduling.volcano.sh", "v1beta1"),
    ),
    processes=(
        VOLCANO_ADMISSION_PROCESS,
        Process("volcano-controllers", "vc-controller-manager"),
        Process("volcano-scheduler", "volcano"),
    ),
    verified="v1.10.0",
)
KUBERAY = Controller(
    "kuberay",
    crds=(("rayjobs.ray.io", "v1"), ("rayclusters.ray.io", "v1")),
    processes=(Process("kuberay-operator", "ray-operator-leader"),),
    verified="v1.6.2",
)
CONTROLLERS = (KUEUE, JOBSET, TRAINING_OPERATOR, MPI_OPERATOR, TRAINER, VOLCANO, KUBERAY)


@dataclass(frozen=True)
class TargetNeeds:
    """What one render target needs: its controllers, and Kueue's integration for its kind
    ("" where Kueue does not queue it: Volcano queues its own jobs)."""

    controllers: tuple[Controller, ...]
    kueue_framework: str


TARGET_NEEDS = {
    "job": TargetNeeds((), "batch/job"),
    "jobset": TargetNeeds((JOBSET,), "jobset.x-k8s.io/jobset"),
    "pytorchjob": TargetNeeds((TRAINING_OPERATOR,), "kubeflow.org/pytorchjob"),
    "tfjob": TargetNeeds((TRAINING_OPERATOR,), "kubeflow.org/tfjob"),
    "trainjob": TargetNeeds((TRAINER, JOBSET), "trainer.kubeflow.org/trainjob"),
    "mpijob": TargetNeeds((MPI_OPERATOR,), "kubeflow.org/mpijob"),
    "volcano": TargetNeeds((VOLCANO,), ""),
    "rayjob": TargetNeeds((KUBERAY,), "ray.io/rayjob"),
}

# Kueue's configuration as its manifests and Helm chart install it, and what gpufleet expects
# in it, as the chart documents it.
KUEUE_CONFIGMAP = "kueue-manager-config"
KUEUE_SETTINGS = "deploy/helm/gpufleet/files/kueue-config.yaml"
MANAGER_CONFIG_KEY = "controller_manager_config.yaml"  # every kubebuilder manager's ConfigMap key

# The Prometheus Operator's kinds the chart's monitoring and spec.metrics.podMonitor create.
PROMETHEUS_OPERATOR_CRDS = tuple(
    f"{p}.monitoring.coreos.com" for p in ("podmonitors", "servicemonitors", "prometheusrules")
)

# GPU nodes (GPU_RESOURCE): the labels GPU feature discovery sets that gpufleet selects by, the
# taint the chart's and the renderers' toleration expects.
GPU_LABELS = (GPU_PRODUCT_LABEL, "nvidia.com/gpu.count")
GPU_TAINT = GPU_RESOURCE  # the renderers tolerate it (NoSchedule, any value)
# The NVIDIA device plugin's DaemonSet, standalone or the GPU Operator's: its name has this.
DEVICE_PLUGIN = "nvidia-device-plugin"

# Cluster DNS: CoreDNS and kube-dns both carry this label on their Service in kube-system.
DNS_NAMESPACE = "kube-system"
DNS_SELECTOR = "k8s-app=kube-dns"

# The platform chart's own objects: this label's value is "<chart name>-<chart version>" (its
# _helpers.tpl); gpufleet's rendered jobs and services carry the app.kubernetes.io ones too.
PLATFORM_CHART_LABEL = ("helm.sh/chart", "gpufleet-")

# Tenant namespaces (the chart labels them) must enforce this Pod Security level.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
TENANT_POD_SECURITY = "restricted"
DEFAULT_STORAGE_CLASS = "storageclass.kubernetes.io/is-default-class"
# RDMA tenants need Multus' kind and nodes advertising RDMA devices (the chart's
# rdma.resourceName, under the spec's RDMA_RESOURCE_PREFIX, which Kueue's quota skips).
NAD_CRD = "network-attachment-definitions.k8s.cni.cncf.io"
RDMA_POLICY = "gpufleet-rdma-restricted"  # the chart's ValidatingAdmissionPolicy and binding
