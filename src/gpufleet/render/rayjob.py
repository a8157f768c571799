"""Target ``rayjob``: a KubeRay RayJob (ray.io/v1) with its RayCluster, for spec.framework ray.

The cluster is a head, which runs no Train worker (``num-cpus: 0``) but the job's driver, and
one worker group of ``spec.nodes`` pods (fixed: replicas = minReplicas = maxReplicas, no
autoscaler, as Kueue's ``ray.io/rayjob`` integration requires) with ``procsPerNode`` CPUs for
Ray each. KubeRay starts Ray in the pods (it writes the containers' ``ray start`` command
itself); the operator submits the driver, the job's entrypoint, to the head's dashboard
(``HTTPMode``: no submitter pod, which the restricted profile would refuse as KubeRay writes
it) and deletes the cluster once the job ends (``shutdownAfterJobFinishes``, which Kueue also
needs). Every pod carries the worker pod's restricted security context, environment and
volumes: the driver on the head reads the checkpoint directory too.
"""

from __future__ import annotations

import shlex

from gpufleet.frameworks.ray import ENV_RAY_USE_GPU
from gpufleet.kube import Obj
from gpufleet.launch.worker import worker_module_args
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.jobparts import queued_labels
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import GPU_RESOURCE, WorkerPod, node_loss_tolerations, pod_metadata
from gpufleet.render.podspec import pod_spec as worker_pod_spec
from gpufleet.spec import TrainingJob

RAY_VERSION = "2.60.0"  # the ray extra's pin (constraints.txt): KubeRay's probes follow it
# The head's ports, by the names KubeRay looks for (its dashboard client needs "dashboard").
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001))
WORKER_GROUP = "workers"


def _ray_pod(job: TrainingJob, *, head: bool) -> Obj:
    """The worker pod, as KubeRay wants it: no command (KubeRay's ``ray start``), the Ray
    ports, the pod's restart policy KubeRay's own; the head without GPUs nor the RDMA
    network (the Train workers' collectives are the workers')."""
    if head and job.spec.rdma is not None:
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"rdma": None})})
    s = job.spec
    env = ((ENV_RAY_USE_GPU, "1" if s.resources.gpu else "0"),)  # the rest: worker_env
    pod = worker_pod_spec(job, WorkerPod(rdzv_host="", container_name="ray-head" if head
                                         else "ray-worker", env=env))  # fmt: skip
    pod.pop("restartPolicy")
    container = pod["containers"][0]
    container.pop("command")
    container["ports"] = [{"name": n, "containerPort": p} for n, p in HEAD_PORTS]
    if head:  # the driver and Ray's services; the Train workers (and GPUs) are the workers'
        container["resources"] = {k: {r: q for r, q in v.items() if r != GPU_RESOURCE}
                                  for k, v in container["resources"].items()}  # fmt: skip
        pod.pop("nodeSelector", None)
        pod["tolerations"] = node_loss_tolerations(job)
    else:
        container.pop("ports")
    return pod


def render_rayjob(job: TrainingJob) -> list[Obj]:
    """One RayJob for ``job`` (its RayCluster in ``rayClusterSpec``)."""
    require_cluster_ready(job, "rayjob")
    s = job.spec
    entrypoint = shlex.join(["python", *worker_module_args(job)])
    params = {"num-cpus": str(s.procs_per_node)}
    if s.resources.gpu:
        params["num-gpus"] = str(s.resources.gpu)
    workers: Obj = {
        "groupName": WORKER_GROUP,
        "replicas": s.nodes,
        "minReplicas": s.nodes,
        "maxReplicas": s.nodes,
        "rayStartParams": params,
        "template": {"metadata": pod_metadata(job, "worker"), "spec": _ray_pod(job, head=False)},
    }
    return [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": {
                "entrypoint": entrypoint,
                "submissionMode": "HTTPMode",
                "shutdownAfterJobFinishes": True,
                "rayClusterSpec": {
                    "rayVersion": RAY_VERSION,
                    "headGroupSpec": {
                        "rayStartParams": {"num-cpus": "0"},
                        "template": {
                            "metadata": pod_metadata(job, "head"),
                            "spec": _ray_pod(job, head=True),
                        },
                    },
                    "workerGroupSpecs": [workers],
                },
            },
        }
    ]
