"""The API kinds gpufleet creates and reads: where each lives (group, version, plural).

Tables, not if-chains (TorchX's habit): ``status`` walks JOB_KINDS in order, ``submit`` and
``cancel`` look up BUILTIN_KINDS for built-in kinds and use the custom-object API for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.kube import Obj


@dataclass(frozen=True)
class Kind:
    """A job kind gpufleet renders: where its objects live in the API."""

    group: str
    version: str
    plural: str
    kind: str
    target: str = ""  # a job kind's: the --target that renders it (gpufleet.render.TARGETS)

    @property
    def api_version(self) -> str:
        """``group/version``, or just ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version


# Top-level job kinds, in the order ``status`` looks for a job of a given name.
JOB_KINDS = [
    Kind("batch", "v1", "jobs", "Job", "job"),
    Kind("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "jobset"),
    Kind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "pytorchjob"),
    Kind("kubeflow.org", "v1", "tfjobs", "TFJob", "tfjob"),
    Kind("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", "trainjob"),
    Kind("kubeflow.org", "v2beta1", "mpijobs", "MPIJob", "mpijob"),
    Kind("batch.volcano.sh", "v1alpha1", "jobs", "Job", "volcano"),
    Kind("ray.io", "v1", "rayjobs", "RayJob", "rayjob"),
]
WORKLOADS = Kind("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
LOCAL_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTER_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue")
PODGROUPS = Kind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
# Rendered next to a job when spec.metrics.podMonitor is set (Prometheus Operator).
PODMONITORS = Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
# Serving (kind InferenceService): custom kinds, and built-in kinds with their typed client call.
SCALED_OBJECTS = Kind("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
SERVING_KINDS = [
    SCALED_OBJECTS,
    Kind("serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"),
]
# Built-in serving kinds, in the order the renderer emits them: (apiVersion, kind) -> the typed
# API class and its method suffix (create_<suffix>, delete_<suffix>). Service goes through core.
BUILTIN_KINDS = {
    ("apps/v1", "Deployment"): ("AppsV1Api", "namespaced_deployment"),
    ("v1", "Service"): ("CoreV1Api", "namespaced_service"),
    ("policy/v1", "PodDisruptionBudget"): ("PolicyV1Api", "namespaced_pod_disruption_budget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): (
        "AutoscalingV2Api",
        "namespaced_horizontal_pod_autoscaler",
    ),
}


def kind_of(obj: Obj) -> Kind:
    """The custom kind of a rendered object; ValueError for one gpufleet never renders."""
    for kind in [*JOB_KINDS, PODMONITORS, *SERVING_KINDS]:
        if kind.api_version == obj["apiVersion"] and kind.kind == obj["kind"]:
            return kind
    raise ValueError(f"not a gpufleet kind: {obj['apiVersion']} {obj['kind']}")
