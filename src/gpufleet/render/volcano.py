"""Target ``volcano``: a Volcano Job (batch.volcano.sh/v1alpha1) with gang scheduling."""

from __future__ import annotations

from gpufleet.kube import Obj
from gpufleet.render.checks import require_cluster_ready
from gpufleet.render.meta import labels, metadata
from gpufleet.render.podspec import WorkerPod, pod_metadata, pod_spec
from gpufleet.spec import TrainingJob

TASK = "worker"


def render_volcano(job: TrainingJob) -> list[Obj]:
    """One Volcano Job: all workers scheduled as a gang (minAvailable = nodes) or none.

    Volcano's ``svc`` plugin makes the headless Service; pod 0, ``<name>-worker-0.<name>``,
    hosts the c10d rendezvous. ``spec.queue`` names the Volcano Queue (default ``default``)
    and ``spec.priority`` a PriorityClass; Kueue does not manage Volcano Jobs, so no Kueue
    labels. A failed or evicted pod restarts the whole job, up to ``maxRetry =
    spec.maxRestarts`` times; Volcano has no restart that is free of that budget, so a
    preemption (exit 75) is retried but counted.
    """
    require_cluster_ready(job, "volcano")
    name = job.metadata.name
    s = job.spec
    pod = pod_spec(job, WorkerPod(rdzv_host=f"{name}-{TASK}-0.{name}"))
    spec: Obj = {
        "schedulerName": "volcano",
        "queue": s.queue or "default",
        "minAvailable": s.nodes,
        # Volcano's webhook turns maxRetry 0 into 3 (mutate_job.go, DefaultMaxRetry): no
        # restart is said with a policy that ends the job on the first failure instead.
        "maxRetry": s.max_restarts or 1,
        # The svc plugin's own NetworkPolicy admits only the job's pods, so Prometheus could not
        # scrape job metrics; the tenant namespace's policies (the chart) already govern traffic.
        "plugins": {
            "svc": ["--publish-not-ready-addresses=true", "--disable-network-policy=true"],
            "env": [],
        },
        "policies": [
            {
                "events": ["PodFailed", "PodEvicted"],
                "action": "RestartJob" if s.max_restarts else "TerminateJob",
            }
        ],
        "tasks": [
            {
                "name": TASK,
                "replicas": s.nodes,
                "minAvailable": s.nodes,
                "template": {"metadata": pod_metadata(job, "worker"), "spec": pod},
            }
        ],
    }
    if s.priority:
        spec["priorityClassName"] = s.priority
    return [
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": metadata(job, labels(job, "trainer", "worker")),
            "spec": spec,
        }
    ]
