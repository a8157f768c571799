"""Spec -> Kubernetes objects (pure functions), and checks on what they produce.

``render(job, target)`` returns plain dicts, so a dry run, golden tests and schema validation
need no cluster. Training targets: ``job`` (Indexed Job + headless Service, any cluster),
``jobset``, ``pytorchjob``, ``trainjob``, ``mpijob`` and ``volcano``; every one builds its pods
with ``render.pod``. The seam for other kinds of workload (the inference renderers): a module
per target with a pure ``render_<target>(spec) -> list[Obj]``, registered in a table like
``TARGETS`` for its spec kind, reusing ``render.pod``'s labels, metadata and security contexts.
"""

from collections.abc import Callable

from gpufleet.render.job import render_indexed_job
from gpufleet.render.jobset import render_jobset
from gpufleet.render.mpijob import render_mpijob
from gpufleet.render.pod import Obj, cluster_errors, pod_monitor
from gpufleet.render.podsecurity import check_restricted, pod_specs_in
from gpufleet.render.pytorchjob import render_pytorchjob
from gpufleet.render.trainjob import render_trainjob
from gpufleet.render.volcano import render_volcano
from gpufleet.spec.models import TrainingJob

TARGETS: dict[str, Callable[[TrainingJob], list[Obj]]] = {
    "job": render_indexed_job,
    "jobset": render_jobset,
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
    "mpijob": render_mpijob,
    "volcano": render_volcano,
}


def render(job: TrainingJob, target: str = "job") -> list[Obj]:
    """Kubernetes objects for ``job`` on ``target``; UserInputError if it cannot run there.
    With ``spec.metrics.podMonitor``, a PodMonitor for the job's pods comes last."""
    return TARGETS[target](job) + pod_monitor(job)


__all__ = ["TARGETS", "Obj", "check_restricted", "cluster_errors", "pod_specs_in", "render"]
