"""Target ``tfjob``: a Kubeflow TFJob (kubeflow.org/v1, Training Operator), for spec.framework
tensorflow."""

from __future__ import annotations

from gpufleet.frameworks.tf.cluster import TF_PORT
from gpufleet.kube import METRICS_PORT_NAME, Obj
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.jobparts import kubeflow_run_policy, queued_labels
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import WorkerPod, pod_metadata, pod_spec
from gpufleet.spec import TrainingJob


def render_tfjob(job: TrainingJob) -> list[Obj]:
    """One TFJob for ``job``: ``nodes`` Workers (no Chief, no PS: MultiWorkerMirroredStrategy
    makes worker 0 the chief), one pod per node.

    The operator gives every replica a headless Service and each pod its TF_CONFIG (the
    workers' ``<name>-worker-<i>.<namespace>.svc:2222`` and the pod's own index), which the
    worker shim uses as given. The pods still run gpufleet's launcher (PyTorch's elastic
    agent, one TensorFlow worker each): ``<name>-worker-0`` hosts its rendezvous, as on the
    pytorchjob target, so a worker that crashes restarts the group in every pod, up to
    ``spec.maxRestarts``. A pod that fails is restarted by the kubelet (OnFailure) and the
    operator fails the job after ``runPolicy.backoffLimit`` such restarts; Kueue admits it
    through its ``kubeflow.org/tfjob`` integration (off in Kueue's default configuration).
    """
    require_cluster_ready(job, "tfjob")
    name = job.metadata.name
    s = job.spec
    pod = pod_spec(job, WorkerPod(rdzv_host=f"{name}-worker-0", container_name="tensorflow"))
    pod["restartPolicy"] = "OnFailure"
    # The operator finds the TensorFlow port by this name (TF_CONFIG's ports); keep the
    # rendezvous and the metrics ports beside it.
    pod["containers"][0]["ports"] = [
        {"name": "tfjob-port", "containerPort": TF_PORT},
        *(p for p in pod["containers"][0]["ports"] if p["name"] in ("rdzv", METRICS_PORT_NAME)),
    ]
    template = {"metadata": pod_metadata(job, "worker"), "spec": pod}
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": {
                "runPolicy": kubeflow_run_policy(job, "None"),
                "tfReplicaSpecs": {
                    "Worker": {
                        "replicas": s.nodes,
                        "restartPolicy": "OnFailure",
                        "template": template,
                    }
                },
            },
        }
    ]
