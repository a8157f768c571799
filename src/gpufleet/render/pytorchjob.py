"""Target ``pytorchjob``: a Kubeflow PyTorchJob (kubeflow.org/v1, Training Operator)."""

from __future__ import annotations

from gpufleet.kube import METRICS_PORT_NAME, Obj
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.jobparts import kubeflow_run_policy, queued_labels
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import RDZV_PORT, WorkerPod, pod_metadata, pod_spec
from gpufleet.spec import TrainingJob


def elastic_policy(job: TrainingJob) -> Obj:
    """``elasticPolicy`` for an elastic range (spec.minNodes): the operator then lets the
    Worker count move within it (an HPA or a person scaling replicas), and the pods' torchrun
    (``--nnodes MIN:MAX``) re-forms the group; the Trainer resumes on the new world size."""
    s = job.spec
    if s.min_nodes is None or s.min_nodes == s.nodes:
        return {}
    policy: Obj = {
        "minReplicas": s.min_nodes,
        "maxReplicas": s.nodes,
        "rdzvBackend": "c10d",
        "maxRestarts": s.max_restarts,
    }
    return {"elasticPolicy": policy}


def render_pytorchjob(job: TrainingJob) -> list[Obj]:
    """One PyTorchJob for ``job``: ``nodes`` Workers and no Master, one pod per node.

    No Master because the training-operator (release 1.9, ``setInitContainer``) then adds an
    ``init-pytorch`` init container to every Worker, an nslookup loop without a
    securityContext, which a tenant namespace enforcing Pod Security "restricted" refuses; with
    Workers only it adds none. The operator gives every replica a headless Service;
    ``<name>-worker-0`` hosts the c10d rendezvous, as pod 0 does on the other targets. Each pod
    runs torchrun (restarts workers in place up to ``spec.maxRestarts``); a pod that fails is
    restarted by the kubelet (restartPolicy OnFailure), and the operator fails the job after
    ``runPolicy.backoffLimit = spec.maxRestarts`` such restarts. The operator has no
    per-exit-code rule that is free of the budget, so a preemption (exit 75) is retried but
    counted.
    """
    require_cluster_ready(job, "pytorchjob")
    name = job.metadata.name
    s = job.spec
    pod = pod_spec(job, WorkerPod(rdzv_host=f"{name}-worker-0", container_name="pytorch"))
    pod["restartPolicy"] = "OnFailure"
    # The operator finds its port by this name (and exports it as MASTER_PORT).
    # Keep the metrics port (named for the PodMonitor): replacing the whole list lost it.
    metrics = [p for p in pod["containers"][0]["ports"] if p["name"] == METRICS_PORT_NAME]
    pod["containers"][0]["ports"] = [
        {"name": "pytorchjob-port", "containerPort": RDZV_PORT},
        *metrics,
    ]
    template = {"metadata": pod_metadata(job, "worker"), "spec": pod}
    replicas: Obj = {
        "Worker": {"replicas": s.nodes, "restartPolicy": "OnFailure", "template": template}
    }
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": metadata(job, queued_labels(job)),
            "spec": {
                "nprocPerNode": str(s.procs_per_node),
                "runPolicy": kubeflow_run_policy(job, "None"),
                **elastic_policy(job),
                "pytorchReplicaSpecs": replicas,
            },
        }
    ]
