"""Target ``job``: an Indexed batch/v1 Job plus a headless Service. Runs on any cluster."""

from __future__ import annotations

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.render.pod import RDZV_PORT, Obj, WorkerPod, labels, pod_spec, require_cluster_ready
from gpufleet.spec.models import TrainingJob


def render_indexed_job(job: TrainingJob) -> list[Obj]:
    """The Service and the Indexed Job for ``job`` (raises UserInputError if it cannot run).

    Pod i is ``<name>-i`` in the headless Service ``<name>``; pod 0 hosts the c10d rendezvous.
    Worker crashes restart inside the pod (torchrun --max-restarts); a failed pod is retried up
    to ``spec.maxRestarts`` times (backoffLimit), and neither a preemption ("preempted" exit
    code after its checkpoint) nor a disruption (node drain, Kueue preemption) counts.
    """
    require_cluster_ready(job)
    name = job.metadata.name
    s = job.spec
    meta_ns = {"namespace": job.metadata.namespace} if job.metadata.namespace else {}
    service: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **meta_ns, "labels": labels(job, "trainer", "rendezvous")},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # DNS must work before pods are ready
            "selector": {"gpufleet.dev/job": name, "gpufleet.dev/role": "worker"},
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}],
        },
    }
    where = WorkerPod(rdzv_host=f"{name}-0.{name}")
    pod = pod_spec(job, where)
    pod["subdomain"] = name
    job_labels = labels(job, "trainer", "worker")
    if s.queue:
        job_labels["kueue.x-k8s.io/queue-name"] = s.queue
    if s.priority:
        job_labels["kueue.x-k8s.io/priority-class"] = s.priority
    indexed: Obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **meta_ns, "labels": job_labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": s.nodes,
            "parallelism": s.nodes,
            "backoffLimit": s.max_restarts,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onExitCodes": {"operator": "In", "values": [EXIT_PREEMPTED]},
                    },
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                ]
            },
            "template": {"metadata": {"labels": labels(job, "trainer", "worker")}, "spec": pod},
        },
    }
    if s.queue:
        indexed["spec"]["suspend"] = True  # Kueue admits (unsuspends) it when quota allows
    return [service, indexed]
