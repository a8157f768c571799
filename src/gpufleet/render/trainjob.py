"""Target ``trainjob``: a Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1)."""

from __future__ import annotations

from gpufleet.kube import Obj
from gpufleet.render.checks import refuse_env_from, require_cluster_ready
from gpufleet.render.jobparts import queued_labels
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import WorkerPod, pod_metadata, pod_spec
from gpufleet.spec import TrainingJob

RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Kubeflow Trainer installs
NODE = "node"  # that runtime's replicated job and container name
# What a TrainJob may patch in its runtime's pod template: Trainer v2.2.0's PodSpecPatch and
# ContainerPatch (pkg/apis/trainer/v1alpha1/trainjob_types.go), whose CRD refuses any other
# field (seen on the local control plane: terminationGracePeriodSeconds, container ports). So
# the grace period and a metrics port are the runtime's; render/checks.py refuses specs that
# need them.
_POD_PATCH = ("securityContext", "tolerations", "nodeSelector", "volumes")
_CONTAINER_PATCH = ("name", "securityContext", "volumeMounts")


def render_trainjob(job: TrainingJob) -> list[Obj]:
    """One TrainJob on the ``torch-distributed`` runtime, patched to gpufleet's pod.

    Trainer builds a JobSet named after the TrainJob with one replicated job ``node``; pod 0,
    ``<name>-node-0-0.<name>``, hosts the c10d rendezvous. The trainer section carries image,
    torchrun command, env and per-node resources; a runtime patch adds the restricted security
    context, GPU tolerations, the GPU product selector and the volumes (the grace period is
    the runtime's: Kubernetes' default 30 s for ``torch-distributed``). Worker restarts happen
    in the pod (torchrun ``--max-restarts``); pod-level retries follow the runtime's JobSet
    failure policy, which the cluster admin owns.
    """
    require_cluster_ready(job, "trainjob")
    refuse_env_from(job, "trainjob", "Kubeflow Trainer's TrainJob has no envFrom")
    name = job.metadata.name
    s = job.spec
    pod = pod_spec(job, WorkerPod(rdzv_host=f"{name}-{NODE}-0-0.{name}", container_name=NODE))
    (container,) = pod["containers"]
    patch_pod = {k: pod[k] for k in _POD_PATCH if k in pod}
    patch_pod["containers"] = [{k: container[k] for k in _CONTAINER_PATCH}]
    trainer: Obj = {
        "image": container["image"],
        "command": container["command"],
        "env": container["env"],
        "numNodes": s.nodes,
        "numProcPerNode": s.procs_per_node,
    }
    if container["resources"]:
        trainer["resourcesPerNode"] = container["resources"]
    patched_job = {
        "name": NODE,
        "template": {
            "spec": {
                "template": {
                    "metadata": pod_metadata(job, "worker"),
                    "spec": patch_pod,
                }
            }
        },
    }
    spec: Obj = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": RUNTIME,
        },
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": "gpufleet.dev/render",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [patched_job]}}},
            }
        ],
    }
    if s.queue:
        spec["suspend"] = True  # Kueue admits (unsuspends) it when quota allows
    return [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": spec,
        }
    ]
