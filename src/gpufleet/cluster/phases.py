"""A job's phase as its own object reports it: conditions (Job, JobSet, Kubeflow's kinds,
TrainJob), Volcano's state, a RayJob's deployment and job status."""

from __future__ import annotations

from gpufleet.kube import Obj

# Job-level condition types of Job, JobSet, PyTorchJob/MPIJob (Kubeflow) and TrainJob.
_TERMINAL = {
    "Complete": "Succeeded",
    "Completed": "Succeeded",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
}
_ACTIVE = {"Suspended": "Suspended", "Restarting": "Restarting", "Running": "Running"}
_VOLCANO = {
    "Completed": "Succeeded",
    "Failed": "Failed",
    "Aborted": "Failed",
    "Terminated": "Failed",
    "Running": "Running",
    "Restarting": "Restarting",
    "Pending": "Pending",
    "Aborting": "Failed",
    "Completing": "Running",
    "Terminating": "Failed",
}
# A RayJob's jobDeploymentStatus (KubeRay); "Complete" is the job's end, whose jobStatus says how.
_RAYJOB = {
    "Failed": "Failed",
    "ValidationFailed": "Failed",
    "Running": "Running",
    "Initializing": "Pending",
    "Waiting": "Pending",
    "Retrying": "Restarting",
    "Suspending": "Suspended",
    "Suspended": "Suspended",
}


def _true_conditions(obj: Obj) -> list[Obj]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return [c for c in conditions if c.get("status") == "True"]


def job_phase(job: Obj) -> tuple[str | None, str]:
    """The phase the job object itself reports, and its message (None: it says nothing yet)."""
    if job.get("apiVersion", "").startswith("batch.volcano.sh/"):
        state = (job.get("status") or {}).get("state") or {}
        phase = _VOLCANO.get(state.get("phase", ""))
        return phase, state.get("message") or state.get("reason") or ""
    if job.get("apiVersion", "").startswith("ray.io/"):
        status = job.get("status") or {}
        deployment = status.get("jobDeploymentStatus", "")
        if deployment == "Complete":
            ok = status.get("jobStatus") == "SUCCEEDED"
            return ("Succeeded" if ok else "Failed"), status.get("message") or ""
        return _RAYJOB.get(deployment), status.get("message") or status.get("reason") or ""
    true = _true_conditions(job)
    for table in (_TERMINAL, _ACTIVE):
        for cond in reversed(true):  # the newest condition wins
            if cond.get("type") in table:
                return table[cond["type"]], cond.get("message") or cond.get("reason") or ""
    return None, ""
