"""Target ``jobset``: a JobSet (jobset.x-k8s.io/v1alpha2) with one replicated Indexed Job."""

from __future__ import annotations

from gpufleet.kube import Obj
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.jobparts import (
    FATAL_RULE_MESSAGE,
    indexed_job_spec,
    queued_labels,
    tf_workers,
)
from gpufleet.render.meta import metadata
from gpufleet.render.podspec import WorkerPod, pod_spec
from gpufleet.spec import TrainingJob

REPLICATED_JOB = "worker"


def render_jobset(job: TrainingJob) -> list[Obj]:
    """One JobSet for ``job`` (raises UserInputError if it cannot run on Kubernetes).

    JobSet makes the headless Service itself (``network.enableDNSHostnames``); pod i is
    ``<name>-worker-0-<i>.<name>`` and pod 0 hosts the c10d rendezvous. A failed pod fails the
    child Job (backoffLimit 0) and the JobSet restarts all workers together, up to
    ``spec.maxRestarts`` times; a preempted worker (exit code 75, after its checkpoint) fails its
    Job through the pod failure policy, and that restart does not count. A fatal exit code
    (2, 4, 5, 6: no restart can fix it) fails the JobSet at once.
    """
    require_cluster_ready(job, "jobset")
    name = job.metadata.name
    s = job.spec
    hosts = [f"{name}-{REPLICATED_JOB}-0-{i}.{name}" for i in range(s.nodes)]
    pod = pod_spec(job, WorkerPod(rdzv_host=hosts[0], env=tf_workers(job, hosts)))
    # The child Job fails on a preemption; the JobSet's rule below restarts the set for free.
    child = indexed_job_spec(job, pod, backoff_limit=0, on_preempted="FailJob")
    jobset: Obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata(job, queued_labels(job)),
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": {
                "maxRestarts": s.max_restarts,
                "rules": [
                    {
                        # A fatal exit code (no usable checkpoint, NaN, storage full, bad
                        # input): no restart can fix it.
                        "name": "fatal",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                        "onJobFailureMessagePatterns": [FATAL_RULE_MESSAGE],
                    },
                    {
                        # A preemption ends in a checkpoint: restart, free of the budget.
                        "name": "preempted",
                        "action": "RestartJobSetAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    },
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
