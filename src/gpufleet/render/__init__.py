"""Spec -> Kubernetes objects (pure functions), and checks on what they produce.

``render(job, target)`` returns plain dicts, so a dry run, golden tests and schema validation
need no cluster. Targets so far: ``job`` (Indexed Job + headless Service), ``jobset``.
"""

from collections.abc import Callable

from gpufleet.render.job import render_indexed_job
from gpufleet.render.jobset import render_jobset
from gpufleet.render.pod import Obj, cluster_errors
from gpufleet.render.podsecurity import check_restricted, pod_specs_in
from gpufleet.spec.models import TrainingJob

TARGETS: dict[str, Callable[[TrainingJob], list[Obj]]] = {
    "job": render_indexed_job,
    "jobset": render_jobset,
}


def render(job: TrainingJob, target: str = "job") -> list[Obj]:
    """Kubernetes objects for ``job`` on ``target``; UserInputError if it cannot run there."""
    return TARGETS[target](job)


__all__ = ["TARGETS", "check_restricted", "cluster_errors", "pod_specs_in", "render"]
