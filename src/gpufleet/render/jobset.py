"""Target ``jobset``: a JobSet (jobset.x-k8s.io/v1alpha2) with one replicated Indexed Job."""

from __future__ import annotations

from gpufleet.errors import EXIT_PREEMPTED
from gpufleet.render.pod import Obj, WorkerPod, labels, pod_spec, require_cluster_ready
from gpufleet.spec.models import TrainingJob

REPLICATED_JOB = "worker"


def render_jobset(job: TrainingJob) -> list[Obj]:
    """One JobSet for ``job`` (raises UserInputError if it cannot run on Kubernetes).

    JobSet makes the headless Service itself (``network.enableDNSHostnames``); pod i is
    ``<name>-worker-0-<i>.<name>`` and pod 0 hosts the c10d rendezvous. A failed pod fails the
    child Job (backoffLimit 0) and the JobSet restarts all workers together, up to
    ``spec.maxRestarts`` times; a preempted worker (exit code 75, after its checkpoint) fails its
    Job through the pod failure policy, and that restart does not count.
    """
    require_cluster_ready(job)
    name = job.metadata.name
    s = job.spec
    meta_ns = {"namespace": job.metadata.namespace} if job.metadata.namespace else {}
    pod = pod_spec(job, WorkerPod(rdzv_host=f"{name}-{REPLICATED_JOB}-0-0.{name}"))
    set_labels = labels(job, "trainer", "worker")
    if s.queue:
        set_labels["kueue.x-k8s.io/queue-name"] = s.queue
    if s.priority:
        set_labels["kueue.x-k8s.io/priority-class"] = s.priority
    child: Obj = {
        "completionMode": "Indexed",
        "completions": s.nodes,
        "parallelism": s.nodes,
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"operator": "In", "values": [EXIT_PREEMPTED]},
                },
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        },
        "template": {"metadata": {"labels": labels(job, "trainer", "worker")}, "spec": pod},
    }
    jobset: Obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, **meta_ns, "labels": set_labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {
                "maxRestarts": s.max_restarts,
                "rules": [
                    {
                        # A preemption ends in a checkpoint: restart, free of the budget.
                        "name": "preempted",
                        "action": "RestartJobSetAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "replicatedJobs": [
                {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": child}}
            ],
        },
    }
    if s.queue:
        jobset["spec"]["suspend"] = True  # Kueue admits (unsuspends) it when quota allows
    return [jobset]
