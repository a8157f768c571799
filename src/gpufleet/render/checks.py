"""Can a TrainingJob run on Kubernetes? Every reason it cannot, with its field path."""

from __future__ import annotations

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import TrainingJob


# The longest name each target's controller derives from the job's name for the last of
# ``nodes`` pods, read in the controllers' sources; each must be a DNS label (63 characters).
# The API server shortens a generateName to fit, so only names set in full count: the Job
# controller's pod hostname <job>-<index>; JobSet's webhook checks <jobset>-<replicatedJob>-
# <jobIndex>-<podIndex>-<5 random> itself (so does Trainer's JobSet, replicated job "node");
# Kubeflow names PyTorchJob, TFJob and MPIJob pods <job>-worker-<i>, the MPI launcher Job
# <job>-launcher; Volcano <job>-<task>-<i>.
def _derived_names(name: str, target: str, nodes: int) -> list[str]:
    last = str(nodes - 1)
    return {
        "job": [f"{name}-{last}"],
        "jobset": [f"{name}-worker-0-{last}-xxxxx"],
        "pytorchjob": [f"{name}-worker-{last}"],
        "tfjob": [f"{name}-worker-{last}"],
        "trainjob": [f"{name}-node-0-{last}-xxxxx"],
        "mpijob": [f"{name}-launcher", f"{name}-worker-{last}"],
        "volcano": [f"{name}-worker-{last}"],
        "rayjob": [f"{name}-xxxxx"],
    }.get(target, [])


# A name a controller refuses below 63 characters: KubeRay's RayCluster, <rayjob>-<5 random>, at
# most MaxRayClusterNameLength (53), so its pods' generated names need no truncating.
_MAX_DERIVED = {"rayjob": 53}


def name_limit(target: str, nodes: int) -> int:
    """The longest job name ``target``'s controller can derive valid names from."""
    longest = max((len(n) for n in _derived_names("", target, nodes)), default=0)
    return _MAX_DERIVED.get(target, 63) - longest


def cluster_errors(job: TrainingJob, target: str | None = None) -> list[FieldError]:
    """Why ``job`` cannot run on Kubernetes (on ``target``, when given; empty: it can)."""
    s = job.spec
    errors = []
    name = job.metadata.name
    longest = max(_derived_names(name, target, s.nodes) if target else [], key=len, default="")
    if len(longest) > _MAX_DERIVED.get(target or "", 63):
        errors.append(
            FieldError(
                "metadata.name",
                f"{len(name)} characters is too long for target {target} with {s.nodes} "
                f"node(s): its controller derives the name {longest!r} ({len(longest)} > "
                f"{_MAX_DERIVED.get(target or '', 63)}); use "
                f"at most {name_limit(target or '', s.nodes)} characters",
            )
        )
    if not s.image:
        errors.append(FieldError("spec.image", "required on Kubernetes: the container image"))
    ckpt = s.checkpoint.dir
    mounts = [v.mount_path for v in s.volumes]
    durable = s.checkpoint.durable.dir if s.checkpoint.durable else None
    if durable and "://" not in durable and not any(_is_under(durable, m) for m in mounts):
        errors.append(FieldError("spec.checkpoint.durable.dir", f"{durable} is not on a volume: "
                                 "the durable tier must outlive the pod; mount one "
                                 "(spec.volumes) at a parent directory or use an fsspec "
                                 "URI"))  # fmt: skip
    if not ckpt and durable:
        pass  # the fast tier in the pod's own run directory (an emptyDir): node-local
    elif not ckpt:
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                "required on Kubernetes, or checkpoints die with the pod: a path under one of "
                "spec.volumes[*].mountPath, or an fsspec URI such as s3://bucket/path",
            )
        )
    elif "://" not in ckpt and not any(_is_under(ckpt, m) for m in mounts):
        errors.append(
            FieldError(
                "spec.checkpoint.dir",
                f"{ckpt} is not on a volume; mount one (spec.volumes) at a parent directory "
                "or use an fsspec URI",
            )
        )
    if target == "trainjob":
        errors += _trainjob_errors(job)
    if s.topology is not None:
        errors += _topology_errors(job, target)
    errors += _range_errors(job, target)
    gpu = s.resources.gpu
    if gpu and gpu % s.procs_per_node:
        errors.append(
            FieldError(
                "spec.resources.gpu",
                f"{gpu} GPUs per node cannot be divided among {s.procs_per_node} processes",
            )
        )
    return errors


def _range_errors(job: TrainingJob, target: str | None) -> list[FieldError]:
    """A node range (spec.minNodes) where the target has none, or where Kueue would have to
    resize a kind it does not (its elastic jobs are batch Jobs without a topology request)."""
    s = job.spec
    if s.min_nodes is None or s.min_nodes == s.nodes:
        return []
    if target in NOT_ELASTIC:
        return [FieldError("spec.minNodes", f"target {target} has no elastic node range "
                           f"({NOT_ELASTIC[target]}): remove spec.minNodes, or use target "
                           "job, jobset or pytorchjob")]  # fmt: skip
    if s.queue and target != "job":
        return [FieldError("spec.minNodes", f"Kueue resizes no {target} (its elastic jobs, "
                           "WorkloadSlices, are batch Jobs): with spec.queue, use target job, "
                           "or remove spec.minNodes")]  # fmt: skip
    if s.queue and s.topology is not None:
        return [FieldError("spec.topology", "Kueue refuses a topology request on an elastic "
                           "job (spec.minNodes with spec.queue): remove one of them")]  # fmt: skip
    return []


# Targets whose controller fixes the number of pods for the job's life.
NOT_ELASTIC = {
    "trainjob": "Kubeflow Trainer's numNodes is fixed",
    "mpijob": "MPI's hostfile is written once, at launch",
    "volcano": "a gang of exactly minAvailable pods",
}


# A TrainJob's pods get their runtime's grace period: torch-distributed sets none, so
# Kubernetes' default.
TRAINJOB_GRACE_PERIOD = 30


def _trainjob_errors(job: TrainingJob) -> list[FieldError]:
    """What a TrainJob cannot carry: Kubeflow Trainer v2.2's runtimePatches patch neither the
    pods' grace period nor container ports (its CRD refuses both)."""
    s, errors = job.spec, []
    if s.preemption.grace_period > TRAINJOB_GRACE_PERIOD:
        errors.append(FieldError("spec.preemption.gracePeriod", (
            f"{s.preemption.grace_period:g} s is longer than target trainjob's pods get: "
            f"its runtime's grace period, {TRAINJOB_GRACE_PERIOD} s (Kubeflow Trainer's "
            "runtimePatches cannot set it); use at most that, or another target")))  # fmt: skip
    if s.metrics.port:
        errors.append(FieldError("spec.metrics.port", (
            "target trainjob cannot declare the metrics container port (Kubeflow Trainer's "
            "runtimePatches patch no ports), so no PodMonitor would find it; declare it in "
            "the ClusterTrainingRuntime and drop it here, or use another target")))  # fmt: skip
    return errors


def _topology_errors(job: TrainingJob, target: str | None) -> list[FieldError]:
    """spec.topology is Kueue's placement: only for a job Kueue queues."""
    if target == "volcano":
        return [FieldError("spec.topology", "target volcano is queued by Volcano, whose "
                           "scheduler does not read Kueue's topology request: remove it, or "
                           "use a target Kueue queues")]  # fmt: skip
    if job.spec.queue is None:
        return [FieldError("spec.topology", "needs spec.queue: Kueue places only the jobs it "
                           "queues (a LocalQueue whose ClusterQueue has a flavor with a "
                           "Topology)")]  # fmt: skip
    return []


def require_cluster_ready(job: TrainingJob, target: str) -> None:
    """Raise UserInputError (exit 2) listing every reason ``job`` cannot run on ``target``."""
    errors = cluster_errors(job, target)
    if errors:
        raise UserInputError(errors)


def _is_under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def refuse_env_from(job: TrainingJob, target: str, why: str) -> None:
    """Targets whose API cannot carry envFrom: exit 2 with the way around."""
    if job.spec.env_from:
        raise UserInputError([FieldError("spec.envFrom", (
            f"the {target} target cannot take envFrom ({why}): name each variable under "
            "spec.env with secretKeyRef or configMapKeyRef"))])  # fmt: skip
