"""What several job targets share around the pod: Kueue's labels, Kubeflow's run policy, an
Indexed JobSpec with gpufleet's pod failure policy."""

from __future__ import annotations

from gpufleet.errors import (
    EXIT_BAD_INPUT,
    EXIT_NO_CHECKPOINT,
    EXIT_NON_FINITE,
    EXIT_PREEMPTED,
    EXIT_STORAGE,
)
from gpufleet.frameworks.tf.cluster import ENV_TF_WORKERS, pod_workers
from gpufleet.kube import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, Obj
from gpufleet.render.meta import labels
from gpufleet.render.podspec import pod_metadata
from gpufleet.spec import TrainingJob


def queued_labels(job: TrainingJob) -> dict[str, str]:
    """Labels of the object Kueue admits: the worker labels plus queue and priority class."""
    out = labels(job, "trainer", "worker")
    if job.spec.queue:
        out[KUEUE_QUEUE_LABEL] = job.spec.queue
    if job.spec.priority:
        out[KUEUE_PRIORITY_LABEL] = job.spec.priority
    return out


def kubeflow_run_policy(job: TrainingJob, clean_pod_policy: str) -> Obj:
    """The runPolicy of Kubeflow jobs (PyTorchJob, MPIJob): the restart budget, and suspended
    for Kueue when the spec names a queue (Kueue admits, i.e. unsuspends, it)."""
    policy: Obj = {"backoffLimit": job.spec.max_restarts, "cleanPodPolicy": clean_pod_policy}
    if job.spec.queue:
        policy["suspend"] = True
    return policy


# Exit codes no restart can fix (gpufleet.launch.fatal): bad input (also another job's
# checkpoints), no usable checkpoint, NaN/Inf, checkpoint storage full or refused. Rule 0 of the
# pod failure policy fails the Job at once on them; JobSet's failure policy matches the Job
# controller's message for that rule ("... matching FailJob rule at index 0").
FATAL_EXIT_CODES = [EXIT_BAD_INPUT, EXIT_NO_CHECKPOINT, EXIT_NON_FINITE, EXIT_STORAGE]
FATAL_RULE_MESSAGE = "matching FailJob rule at index 0"


def indexed_job_spec(job: TrainingJob, pod: Obj, *, backoff_limit: int, on_preempted: str) -> Obj:
    """An Indexed JobSpec with one pod per node; ``on_preempted`` is the pod failure policy's
    action for the "preempted" exit code (Ignore: retry free; FailJob: let the parent decide).
    Disruptions (node drain, Kueue preemption) never count against the restart budget; a fatal
    exit code fails the Job at once (no futile restarts)."""
    return {
        "completionMode": "Indexed",
        "completions": job.spec.nodes,
        "parallelism": job.spec.nodes,
        "backoffLimit": backoff_limit,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"operator": "In", "values": FATAL_EXIT_CODES},
                },
                {
                    "action": on_preempted,
                    "onExitCodes": {"operator": "In", "values": [EXIT_PREEMPTED]},
                },
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        },
        "template": {"metadata": pod_metadata(job, "worker"), "spec": pod},
    }


def tf_workers(job: TrainingJob, hosts: list[str]) -> tuple[tuple[str, str], ...]:
    """For a TensorFlow job (spec.framework), every worker's address by index, pod ``i`` at
    ``hosts[i]`` (the worker shim builds TF_CONFIG from it and the pod's completion index);
    nothing for a PyTorch job."""
    if job.spec.framework != "tensorflow":
        return ()
    return ((ENV_TF_WORKERS, pod_workers(hosts)),)
