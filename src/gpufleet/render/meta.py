"""Labels and ObjectMeta of every object gpufleet renders, for jobs and services alike."""

from __future__ import annotations

from gpufleet.kube import LABEL_JOB, LABEL_QUEUE, LABEL_ROLE, LABEL_TENANT, Obj
from gpufleet.spec import Metadata, TrainingJob
from gpufleet.spec.inference import InferenceService


def standard_labels(
    meta: Metadata, component: str, role: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The labels of every object gpufleet renders, for jobs and services alike: the GPU
    exporter attributes GPUs by gpufleet.dev/job and tenant."""
    return {
        # The user's first: gpufleet's own keys below always win (validation refuses them too).
        **meta.labels,
        "app.kubernetes.io/name": "gpufleet",
        "app.kubernetes.io/instance": meta.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpufleet",
        "app.kubernetes.io/managed-by": "gpufleet",
        LABEL_JOB: meta.name,
        LABEL_TENANT: meta.namespace or "default",
        LABEL_ROLE: role,
        **(extra or {}),
    }


def labels(job: TrainingJob, component: str, role: str) -> dict[str, str]:
    """The standard labels of every object a job renders."""
    # The queue label lets the GPU exporter attribute usage to queues (Kueue labels only the job).
    queue = {LABEL_QUEUE: job.spec.queue} if job.spec.queue else {}
    return standard_labels(job.metadata, component, role, queue)


def metadata(job: TrainingJob | InferenceService, obj_labels: dict[str, str]) -> Obj:
    """ObjectMeta of a top-level object: the spec's name, namespace (if any) and labels."""
    meta: Obj = {"name": job.metadata.name}
    if job.metadata.namespace:
        meta["namespace"] = job.metadata.namespace
    meta["labels"] = obj_labels
    return meta
