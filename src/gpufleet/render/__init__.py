"""Spec -> Kubernetes objects (pure functions), and checks on what they produce.

``render(job, target)`` returns plain dicts, so a dry run, golden tests and schema validation
need no cluster. Training targets: ``job`` (Indexed Job + headless Service, any cluster),
``jobset``, ``pytorchjob``, ``trainjob``, ``mpijob`` and ``volcano``; every one builds its pods
with ``render.podspec``. Serving targets (kind InferenceService, ``render.serving``): ``triton``
(Deployment, Service, PodDisruptionBudget, HPA or KEDA ScaledObject) and ``kserve``.
"""

from collections.abc import Callable

from gpufleet.errors import FieldError, UserInputError
from gpufleet.kube import Obj
from gpufleet.render.checks import cluster_errors
from gpufleet.render.job import render_indexed_job
from gpufleet.render.jobset import render_jobset
from gpufleet.render.monitoring import pod_monitor
from gpufleet.render.mpijob import render_mpijob
from gpufleet.render.podsecurity import check_restricted, pod_specs_in
from gpufleet.render.pytorchjob import render_pytorchjob
from gpufleet.render.rayjob import render_rayjob
from gpufleet.render.serving import render_kserve, render_triton
from gpufleet.render.tfjob import render_tfjob
from gpufleet.render.trainjob import render_trainjob
from gpufleet.render.volcano import render_volcano
from gpufleet.spec import TrainingJob
from gpufleet.spec.inference import InferenceService

TARGETS: dict[str, Callable[[TrainingJob], list[Obj]]] = {
    "job": render_indexed_job,
    "jobset": render_jobset,
    "pytorchjob": render_pytorchjob,
    "trainjob": render_trainjob,
    "mpijob": render_mpijob,
    "volcano": render_volcano,
    "tfjob": render_tfjob,
    "rayjob": render_rayjob,
}
# The targets each framework's workers run on (spec.framework), its default first.
FRAMEWORK_TARGETS: dict[str, tuple[str, ...]] = {
    "pytorch": ("job", "jobset", "pytorchjob", "trainjob", "mpijob", "volcano"),
    "tensorflow": ("job", "jobset", "tfjob"),
    "ray": ("rayjob",),
    "horovod": ("mpijob",),
}


SERVING_TARGETS: dict[str, Callable[[InferenceService], list[Obj]]] = {
    "triton": render_triton,
    "kserve": render_kserve,
}


def targets_for(spec: TrainingJob | InferenceService) -> list[str]:
    """The targets a spec of this kind (and framework) renders to, the default first."""
    if isinstance(spec, InferenceService):
        return list(SERVING_TARGETS)
    return list(FRAMEWORK_TARGETS[spec.spec.framework])


def render(job: TrainingJob, target: str = "job") -> list[Obj]:
    """Kubernetes objects for ``job`` on ``target``; UserInputError if it cannot run there.
    With ``spec.metrics.podMonitor``, a PodMonitor for the job's pods comes last."""
    allowed = FRAMEWORK_TARGETS[job.spec.framework]
    if target not in allowed:
        runs = " or ".join(f for f, targets in FRAMEWORK_TARGETS.items() if target in targets)
        message = (f"is {job.spec.framework}, but target {target} runs {runs} workers; "
                   f"a {job.spec.framework} job renders to {', '.join(allowed)}")  # fmt: skip
        raise UserInputError([FieldError("spec.framework", message)])
    return TARGETS[target](job) + pod_monitor(job)


def render_spec(spec: TrainingJob | InferenceService, target: str | None = None) -> list[Obj]:
    """Objects for a spec of any kind on ``target`` (default: the kind's first target)."""
    target = target or targets_for(spec)[0]
    if isinstance(spec, InferenceService):
        return SERVING_TARGETS[target](spec)
    return render(spec, target)


__all__ = [
    "FRAMEWORK_TARGETS",
    "SERVING_TARGETS",
    "TARGETS",
    "Obj",
    "check_restricted",
    "cluster_errors",
    "pod_specs_in",
    "render",
    "render_spec",
    "targets_for",
]
